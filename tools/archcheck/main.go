// Command archcheck holds the code to the layers docs/architecture.md
// draws: it reads the table under "## Layers", lists every package of the
// module with `go list`, and fails on a package the table does not place
// or an import that runs upward. The table is the rule, so a new package
// cannot land without a line in the docs saying where it sits.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// layer is one row of the table.
type layer struct {
	rank     int
	patterns []string
	// sameRank says whether a package may import another of its own layer.
	sameRank bool
}

// pkg is one package of the module and the module's packages it imports
// (outside its tests: a test may lean on a kit of a higher layer).
type pkg struct {
	path    string
	imports []string
}

func main() {
	root := flag.String("root", ".", "the module's root folder")
	flag.Parse()
	if err := run(*root); err != nil {
		fmt.Fprintln(os.Stderr, "archcheck:", err)
		os.Exit(1)
	}
	fmt.Println("archcheck: every package sits in its layer; no import runs upward")
}

// run checks the module at root against its docs/architecture.md.
func run(root string) error {
	docPath := filepath.Join(root, "docs", "architecture.md")
	b, err := os.ReadFile(docPath)
	if err != nil {
		return fmt.Errorf("read the layers table: %w", err)
	}
	layers, err := parseLayers(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", docPath, err)
	}
	pkgs, err := listPackages(root)
	if err != nil {
		return err
	}
	if problems := check(layers, pkgs); len(problems) > 0 {
		noun := "problems"
		if len(problems) == 1 {
			noun = "problem"
		}
		return fmt.Errorf("%d %s against %s:\n  %s", len(problems), noun, docPath, strings.Join(problems, "\n  "))
	}
	return nil
}

var rowPattern = regexp.MustCompile("^\\|\\s*(\\d+)\\s*\\|(.*)\\|\\s*(yes|no)\\b[^|]*\\|\\s*$")
var codePattern = regexp.MustCompile("`([^`]+)`")

// parseLayers reads the table of the "## Layers" section.
func parseLayers(doc string) ([]layer, error) {
	_, section, ok := strings.Cut(doc, "\n## Layers\n")
	if !ok {
		return nil, errors.New(`no "## Layers" section`)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	var layers []layer
	for _, line := range strings.Split(section, "\n") {
		m := rowPattern.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		rank, _ := strconv.Atoi(m[1])
		l := layer{rank: rank, sameRank: m[3] == "yes"}
		for _, c := range codePattern.FindAllStringSubmatch(m[2], -1) {
			l.patterns = append(l.patterns, c[1])
		}
		if len(l.patterns) == 0 {
			return nil, fmt.Errorf("layer %d names no package", rank)
		}
		layers = append(layers, l)
	}
	if len(layers) == 0 {
		return nil, errors.New(`the "## Layers" section has no table rows ("| rank | packages | yes or no |")`)
	}
	return layers, nil
}

// place finds the layer of a package path relative to the module: an
// exact name wins over a folder pattern, a longer folder over a shorter.
func place(layers []layer, path string) (layer, bool) {
	var best layer
	bestLen := -1
	for _, l := range layers {
		for _, p := range l.patterns {
			switch {
			case p == path:
				return l, true
			case strings.HasSuffix(p, "/*") && strings.HasPrefix(path, strings.TrimSuffix(p, "*")):
				if len(p) > bestLen {
					best, bestLen = l, len(p)
				}
			}
		}
	}
	return best, bestLen >= 0
}

// check returns, in a stable order, every package the table does not
// place and every import that runs upward or sideways where its layer
// forbids that.
func check(layers []layer, pkgs []pkg) []string {
	var problems []string
	for _, p := range pkgs {
		from, ok := place(layers, p.path)
		if !ok {
			problems = append(problems, fmt.Sprintf("%s is in no layer: add it to the table", p.path))
			continue
		}
		for _, imp := range p.imports {
			to, ok := place(layers, imp)
			switch {
			case !ok:
				continue // reported as a package of its own
			case to.rank > from.rank:
				problems = append(problems, fmt.Sprintf("%s (layer %d) imports %s (layer %d): an import running upward", p.path, from.rank, imp, to.rank))
			case to.rank == from.rank && !from.sameRank:
				problems = append(problems, fmt.Sprintf("%s imports %s: packages of layer %d do not import each other", p.path, imp, from.rank))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

// listPackages asks the go command for the module's packages and their
// imports, named relative to the module.
func listPackages(root string) ([]pkg, error) {
	mod, err := goCmd(root, "list", "-m")
	if err != nil {
		return nil, err
	}
	prefix := strings.TrimSpace(mod) + "/"
	out, err := goCmd(root, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	if err != nil {
		return nil, err
	}
	var pkgs []pkg
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		p := pkg{path: strings.TrimPrefix(fields[0], prefix)}
		for _, imp := range fields[1:] {
			if rel, ok := strings.CutPrefix(imp, prefix); ok {
				p.imports = append(p.imports, rel)
			}
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

func goCmd(dir string, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
