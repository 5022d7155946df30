package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"
)

// docLine is a helm command line a document shows.
type docLine struct {
	where string
	text  string
}

// docFiles are the documents whose helm lines are checked, from the
// repository's root, where their commands are run.
var docFiles = []string{"deploy/helm/deskway/README.md", "docs/operations.md"}

var shBlock = regexp.MustCompile("(?s)```sh\n(.*?)```")

// docLines returns every helm install, upgrade or template line in the
// documents' sh blocks, continuation lines joined.
func docLines(repo string) ([]docLine, error) {
	var out []docLine
	for _, f := range docFiles {
		b, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			return nil, err
		}
		for _, m := range shBlock.FindAllStringSubmatch(string(b), -1) {
			text := strings.ReplaceAll(m[1], "\\\n", " ")
			for _, l := range strings.Split(text, "\n") {
				l = strings.Join(strings.Fields(l), " ")
				if strings.HasPrefix(l, "helm install ") || strings.HasPrefix(l, "helm upgrade ") || strings.HasPrefix(l, "helm template ") {
					out = append(out, docLine{where: f, text: l})
				}
			}
		}
	}
	return out, nil
}

// checkDocLine renders the chart as the line asks, with Helm's own
// parsing of --set and values files, and checks what it renders as the
// cases are checked.
func checkDocLine(repo string, l docLine) []string {
	args := strings.Fields(l.text)[2:]
	// As helm does: values files in order, then every --set.
	vals := map[string]any{}
	var sets []func() error
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func() (string, error) {
			if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
				return v, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("%s needs a value", a)
			}
			i++
			return args[i], nil
		}
		flag, _, _ := strings.Cut(a, "=")
		var err error
		switch flag {
		case "-f", "--values":
			var f string
			if f, err = next(); err == nil {
				var more chartutil.Values
				if more, err = chartutil.ReadValuesFile(filepath.Join(repo, f)); err == nil {
					vals = chartutil.CoalesceTables(more.AsMap(), vals)
				}
			}
		case "--set":
			var s string
			if s, err = next(); err == nil {
				sets = append(sets, func() error { return strvals.ParseInto(s, vals) })
			}
		case "--set-string":
			var s string
			if s, err = next(); err == nil {
				sets = append(sets, func() error { return strvals.ParseIntoString(s, vals) })
			}
		case "-n", "--namespace", "--version", "--timeout":
			_, err = next()
		case "--install", "--create-namespace", "--wait", "--atomic":
		default:
			if strings.HasPrefix(a, "-") {
				err = fmt.Errorf("chartcheck does not know helm's %s", a)
			} else {
				pos = append(pos, a)
			}
		}
		if err != nil {
			return []string{err.Error()}
		}
	}
	for _, set := range sets {
		if err := set(); err != nil {
			return []string{err.Error()}
		}
	}
	if len(pos) != 2 {
		return []string{fmt.Sprintf("want a release name and a chart, got %q", pos)}
	}
	ch, err := loader.Load(filepath.Join(repo, pos[1]))
	if err != nil {
		return []string{err.Error()}
	}
	r, err := render(ch, vals, newCluster(nil), false)
	if err != nil {
		return []string{err.Error()}
	}
	return productionProblems(r, nil, nil)
}
