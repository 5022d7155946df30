// Command chartcheck checks deskway's Helm chart the way helm lint and
// helm template do, with Helm's own Go packages, and then decodes every
// object it renders strictly with the Kubernetes API types (and the
// Prometheus Operator's, for ServiceMonitors), so a field Kubernetes does
// not know, or one of the wrong type, is an error rather than something a
// cluster drops in silence:
//
//	cd tools/chartcheck && go run . -repo ../.. -out /tmp/rendered
//
// It renders three cases: the chart's defaults with no values at all, a
// farm (three gateways on PostgreSQL whose whole URL is an existing
// Secret, two brokers on PostgreSQL with a password the chart keeps, two
// portals with the console, two stream servers on a shared store, a
// ServiceMonitor) and
// the committed production example (examples/production.yaml: existing
// Secrets and PostgreSQL). Each must pass helm lint --strict, decode
// strictly, meet Pod Security "restricted" and the chart's production
// rules (checks.go), keep its generated secrets on upgrade and restart
// pods when a Secret they read changes (upgrade.go). Every helm command
// line the chart's README and docs/operations.md show is rendered and
// checked as written (doclines.go), and values the chart cannot work
// with must be refused with their reason.
//
// With -out it writes, for each case and role, the files the role's pod
// would see (its deskway.yaml and every secret file it mounts, taken from
// the rendered Secrets or from the case's stand-ins for existing ones)
// under OUT/CASE/ROLE/ (OUT/CASE/ROLE-N/ for each broker pod on
// PostgreSQL, whose file names the others as its peers), for deskway
// config validate.
//
// It is a module of its own, so that the Kubernetes packages stay out of
// deskway's.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
)

// A checkCase is values to render, the Secrets the cluster already has
// for them (their stand-ins), and the secret values given inline, which
// must appear in no object but a Secret.
type checkCase struct {
	name     string
	values   map[string]any
	existing map[string]map[string]string
	inline   []string
}

// refusals are values the chart must refuse, with words its message holds.
var refusals = []struct {
	name   string
	values map[string]any
	says   string
}{
	{"brokers without a database", map[string]any{"broker": map[string]any{"replicas": 2}}, "broker.database.url"},
	{"stream without a store", map[string]any{"stream": map[string]any{"enabled": true}}, "stream.storeClaim"},
	{"a user without a password", map[string]any{"auth": map[string]any{"users": []any{map[string]any{"name": "alice"}}}}, "auth.users[0] (alice) needs password"},
	{"a password in the database URL", map[string]any{"broker": map[string]any{"database": map[string]any{"url": "postgres://deskway:hunter2@pg:5432/deskway"}}}, "/broker/database/url"},
	{"a database URL key without its Secret", map[string]any{"broker": map[string]any{"database": map[string]any{"urlKey": "url"}}}, "broker.database.urlKey needs broker.database.existingSecret"},
	{"both a database URL and its key", map[string]any{"broker": map[string]any{"database": map[string]any{"url": "postgres://deskway@pg:5432/deskway", "existingSecret": "db", "urlKey": "url"}}}, "broker.database takes url or urlKey, not both"},
	{"a farm database URL key without its Secret", map[string]any{"gateway": map[string]any{"farmDatabase": map[string]any{"urlKey": "url"}}}, "gateway.farmDatabase.urlKey needs gateway.farmDatabase.existingSecret"},
	{"a misspelt section", map[string]any{"gatway": map[string]any{"replicas": 1}}, "gatway"},
	{"a short token key", map[string]any{"tokenKey": map[string]any{"value": "0123456789"}}, "/tokenKey/value"},
	{"replicas as words", map[string]any{"gateway": map[string]any{"replicas": "two"}}, "/gateway/replicas"},
	{"a peer timeout a launch cannot wait for", map[string]any{"broker": map[string]any{"peers": map[string]any{"timeout": "30s"}}}, "/broker/peers/timeout"},
}

func main() {
	repo := flag.String("repo", "../..", "the deskway repository")
	out := flag.String("out", "", "where to write each case's pod files (default: nowhere)")
	flag.Parse()
	chartDir := filepath.Join(*repo, "deploy", "helm", "deskway")
	failed := false
	fail := func(format string, a ...any) {
		failed = true
		log.Printf(format, a...)
	}
	for _, f := range []string{"README.md", "values.schema.json", "templates/NOTES.txt", "examples/production.yaml"} {
		if _, err := os.Stat(filepath.Join(chartDir, f)); err != nil {
			fail("the chart has no %s", f)
		}
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		log.Fatalf("chartcheck: %v", err)
	}
	cases, err := allCases(chartDir)
	if err != nil {
		log.Fatalf("chartcheck: %v", err)
	}
	lint := action.NewLint()
	lint.Strict = true
	for _, c := range cases {
		res := lint.Run([]string{chartDir}, c.values)
		for _, m := range res.Messages {
			if m.Severity > support.InfoSev { // an icon is recommended, nothing more
				fail("lint (%s): %s", c.name, m)
			}
		}
		for _, err := range res.Errors {
			fail("lint (%s): %v", c.name, err)
		}
	}
	for _, c := range cases {
		r, err := render(ch, c.values, newCluster(c.existing), false)
		if err != nil {
			fail("render (%s): %v", c.name, err)
			continue
		}
		if strings.TrimSpace(r.notes) == "" {
			fail("%s: NOTES.txt renders empty", c.name)
		}
		for _, p := range productionProblems(r, c.inline, c.existing) {
			fail("%s: %s", c.name, p)
		}
		for _, p := range upgradeProblems(ch, c) {
			fail("%s: %s", c.name, p)
		}
		log.Printf("%s: %s", c.name, strings.Join(r.kinds(), ", "))
		if *out != "" {
			if err := writePodFiles(filepath.Join(*out, c.name), r, c.existing); err != nil {
				fail("%s: %v", c.name, err)
			}
			var all strings.Builder
			for _, o := range r.objects {
				fmt.Fprintf(&all, "---\n# %s\n%s\n", o.file, strings.TrimSpace(o.raw))
			}
			if err := os.WriteFile(filepath.Join(*out, c.name, "manifests.yaml"), []byte(all.String()), 0o644); err != nil {
				fail("%s: %v", c.name, err)
			}
		}
	}
	lines, err := docLines(*repo)
	if err != nil {
		fail("%v", err)
	}
	for _, l := range lines {
		for _, p := range checkDocLine(*repo, l) {
			fail("%s (%s): %s", l.where, l.text, p)
		}
	}
	if len(lines) == 0 {
		fail("the chart's README.md shows no helm command line")
	}
	for _, r := range refusals {
		_, err := render(ch, r.values, newCluster(nil), false)
		if err == nil || !strings.Contains(err.Error(), r.says) {
			fail("refusal (%s): rendered with %v, want an error naming %s", r.name, err, r.says)
		}
	}
	if failed {
		os.Exit(1)
	}
	log.Printf("chartcheck: lint, render, strict decoding, Pod Security restricted, upgrade and %d documented command lines passed", len(lines))
}

// allCases are the values chartcheck renders: the defaults, a farm and
// the production example.
func allCases(chartDir string) ([]checkCase, error) {
	prod, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "examples", "production.yaml"))
	if err != nil {
		return nil, fmt.Errorf("examples/production.yaml: %w", err)
	}
	crt, key, err := selfSigned("gateway.example.com", "desk-deskway-broker")
	if err != nil {
		return nil, err
	}
	farm := map[string]any{
		"extraConfig": map[string]any{"log": map[string]any{"format": "json"}, "auth": map[string]any{"max_failures": 3}},
		"tokenKey":    map[string]any{"value": "farm-token-key-0123456789abcdef0123456789"},
		"admin":       map[string]any{"tokens": []any{"farm-admin-token-one-0123456789", "farm-admin-token-two-0123456789"}},
		"auth": map[string]any{"users": []any{
			map[string]any{"name": "alice", "groups": []any{"staff", "desk-admins"}, "password": "farm-alice-password"},
			map[string]any{"name": "bob", "groups": []any{"staff"}, "ntHash": "8846f7eaee8fb117ad06bdd830b7586c", "zone": "east"},
		}},
		"gateway": map[string]any{"replicas": 3, "proxyProtocolFrom": []any{"10.1.0.0/16"},
			"farmDatabase": map[string]any{"existingSecret": "farm-db", "urlKey": "dsn"},
			"extraConfig":  map[string]any{"gateway": map[string]any{"idle_timeout": "1h"}}},
		"broker": map[string]any{"replicas": 2,
			"database":    map[string]any{"url": "postgres://deskway@pg:5432/broker?sslmode=require", "password": "farm-pg-password-broker"},
			"extraConfig": map[string]any{"broker": map[string]any{"max_concurrent_launches": 200}}},
		"web": map[string]any{"replicas": 2, "publicURL": "https://desk.example.com", "console": map[string]any{"admins": []any{"desk-admins"}},
			"cookieKey": map[string]any{"value": "farm-cookie-key-0123456789abcdef0123456789"}},
		"stream": map[string]any{"enabled": true, "replicas": 2, "storeClaim": "vdisk-store",
			"vdisks": []any{map[string]any{"name": "win11", "base": "/var/lib/deskway/store/win11.img"}}},
		"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}}},
	}
	return []checkCase{
		{name: "defaults", values: map[string]any{}},
		{name: "farm", values: farm, existing: map[string]map[string]string{"farm-db": {"dsn": "postgres://deskway:farm-pg-password-gw@pg:5432/farm?sslmode=require"}},
			inline: []string{"farm-token-key-0123456789abcdef0123456789", "farm-admin-token-one-0123456789",
				"farm-admin-token-two-0123456789", "farm-alice-password", "8846f7eaee8fb117ad06bdd830b7586c", "farm-pg-password-gw",
				"farm-pg-password-broker", "farm-cookie-key-0123456789abcdef0123456789"}},
		{name: "production", values: prod, existing: productionSecrets(crt, key), inline: []string{"prod-broker-pg-password"}},
	}, nil
}

// productionSecrets stand in for the Secrets examples/production.yaml
// names, as an operator would have made them before installing.
func productionSecrets(crt, key string) map[string]map[string]string {
	return map[string]map[string]string{
		"deskway-token-key": {"token-key": "prod-token-key-0123456789abcdef0123456789"},
		"deskway-tls":       {"tls.crt": crt, "tls.key": key},
		"deskway-admin":     {"ops": "prod-admin-token-ops-0123456789", "ci": "prod-admin-token-ci-0123456789"},
		"deskway-postgres":  {"password": "prod-pg-password"},
		"deskway-broker-db": {"url": "postgres://deskway:prod-broker-pg-password@postgres.db.svc:5432/deskway?sslmode=require"},
		"deskway-portal":    {"cookie-key": "prod-cookie-key-0123456789abcdef0123456789"},
		"deskway-users":     {"breakglass": "prod-breakglass-password"},
		"deskway-oidc":      {"client-secret": "prod-oidc-client-secret"},
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
