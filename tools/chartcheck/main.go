// Command chartcheck checks deskway's Helm chart the way helm lint and
// helm template do, with Helm's own Go packages, and then decodes every
// object it renders strictly with the Kubernetes API types, so a field
// Kubernetes does not know, or one of the wrong type, is an error rather
// than something a cluster drops in silence:
//
//	cd tools/chartcheck && go run . -chart ../../deploy/helm/deskway -out /tmp/rendered
//
// It renders the chart's defaults and a farm (three gateways with a
// certificate, two brokers on PostgreSQL, two stream servers on a shared
// store), checks that invalid values are refused with their message, and
// writes each case's manifests and deskway configuration files to -out.
// It is a module of its own, so that the Kubernetes packages stay out of
// deskway's.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint/support"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

const tokenKey = "0123456789abcdef0123456789abcdef"

// cases are the values rendered; each must pass.
var cases = map[string]map[string]any{
	"defaults": {"tokenKey": map[string]any{"value": tokenKey}, "gateway": map[string]any{"replicas": 1}, "broker": map[string]any{"replicas": 1}},
	"farm": {
		"tokenKey": map[string]any{"value": tokenKey},
		"tls":      map[string]any{"existingSecret": "gateway-tls"},
		"gateway":  map[string]any{"replicas": 3, "proxyProtocolFrom": []any{"10.1.0.0/16"}, "farmDatabase": "postgres://deskway:pw@pg:5432/farm"},
		"broker":   map[string]any{"replicas": 2, "databaseURL": "postgres://deskway:pw@pg:5432/broker"},
		"stream": map[string]any{"enabled": true, "replicas": 2, "storeClaim": "vdisk-store",
			"extraConfig": "vdisks:\n- {name: win11, base: /var/lib/deskway/store/win11.img}\n"},
	},
}

// refusals are values the chart must refuse, with words its message holds.
var refusals = map[string]struct {
	values map[string]any
	says   string
}{
	"no token key":         {map[string]any{}, "tokenKey"},
	"farm without TLS":     {map[string]any{"tokenKey": map[string]any{"value": tokenKey}, "gateway": map[string]any{"replicas": 2}, "broker": map[string]any{"replicas": 1}}, "tls.existingSecret"},
	"brokers without a db": {map[string]any{"tokenKey": map[string]any{"value": tokenKey}, "gateway": map[string]any{"replicas": 1}, "broker": map[string]any{"replicas": 2}}, "broker.databaseURL"},
	"stream without store": {map[string]any{"tokenKey": map[string]any{"value": tokenKey}, "gateway": map[string]any{"replicas": 1}, "broker": map[string]any{"replicas": 1}, "stream": map[string]any{"enabled": true}}, "stream.storeClaim"},
}

func main() {
	chartDir := flag.String("chart", "../../deploy/helm/deskway", "the chart's directory")
	out := flag.String("out", "", "where to write each case's manifests and deskway configuration (default: nowhere)")
	flag.Parse()
	failed := false
	fail := func(format string, a ...any) {
		failed = true
		log.Printf(format, a...)
	}

	lint := action.NewLint()
	lint.Strict = true
	for name, vals := range cases {
		res := lint.Run([]string{*chartDir}, vals)
		for _, m := range res.Messages {
			if m.Severity > support.InfoSev { // an icon is recommended, nothing more
				fail("lint (%s): %s", name, m)
			}
		}
		for _, err := range res.Errors {
			fail("lint (%s): %v", name, err)
		}
	}

	ch, err := loader.Load(*chartDir)
	if err != nil {
		log.Fatalf("chartcheck: %v", err)
	}
	names := make([]string, 0, len(cases))
	for n := range cases {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		files, err := render(ch, cases[name])
		if err != nil {
			fail("render (%s): %v", name, err)
			continue
		}
		kinds, configs, err := decode(files)
		if err != nil {
			fail("decode (%s): %v", name, err)
			continue
		}
		log.Printf("%s: %s", name, strings.Join(kinds, ", "))
		if *out != "" {
			dir := filepath.Join(*out, name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				log.Fatal(err)
			}
			var all bytes.Buffer
			for _, f := range sortedKeys(files) {
				fmt.Fprintf(&all, "---\n# %s\n%s\n", f, files[f])
			}
			if err := os.WriteFile(filepath.Join(dir, "manifests.yaml"), all.Bytes(), 0o644); err != nil {
				log.Fatal(err)
			}
			for role, body := range configs {
				if err := os.WriteFile(filepath.Join(dir, role), []byte(body), 0o644); err != nil {
					log.Fatal(err)
				}
			}
		}
	}
	for name, r := range refusals {
		_, err := render(ch, r.values)
		if err == nil || !strings.Contains(err.Error(), r.says) {
			fail("refusal (%s): rendered with %v, want an error naming %s", name, err, r.says)
		}
	}
	if failed {
		os.Exit(1)
	}
	log.Print("chartcheck: lint, render and strict decoding passed")
}

// render is helm template: the chart with vals, as release "desk".
func render(ch *chart.Chart, vals map[string]any) (map[string]string, error) {
	opts := chartutil.ReleaseOptions{Name: "desk", Namespace: "deskway", Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(ch, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for f, body := range files {
		if strings.HasSuffix(f, ".yaml") && strings.TrimSpace(body) != "" {
			out[f] = body
		}
	}
	return out, nil
}

// decode reads every object of every rendered file strictly with the
// Kubernetes types and returns their kinds and the deskway configuration
// files the config Secret carries.
func decode(files map[string]string) (kinds []string, configs map[string]string, err error) {
	strict := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
	configs = map[string]string{}
	for _, f := range sortedKeys(files) {
		for _, doc := range strings.Split(files[f], "\n---") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			obj, gvk, err := strict.Decode([]byte(doc), nil, nil)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", f, err)
			}
			kinds = append(kinds, gvk.Kind)
			if s, ok := obj.(*corev1.Secret); ok && strings.HasSuffix(s.Name, "-config") {
				for k, v := range s.StringData {
					if strings.HasSuffix(k, ".yaml") {
						var any map[string]any
						if err := yaml.UnmarshalStrict([]byte(v), &any); err != nil {
							return nil, nil, fmt.Errorf("%s: %s is not YAML: %w", f, k, err)
						}
						configs[k] = v
					}
				}
			}
		}
	}
	return kinds, configs, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
