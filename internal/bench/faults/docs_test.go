package faults

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocumentedCommandsRan: every `deskway bench faults` line the README
// and the docs show names scenarios that exist, and one that names an
// --out directory is the very command that directory's result.md says
// made its table (the bench writes the line it ran), so a table cannot
// be credited to a command that did not make it.
func TestDocumentedCommandsRan(t *testing.T) {
	root := "../../.."
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"), filepath.Join(root, "docs", "benchmarks", "faults", "README.md"))
	// A command may be wrapped over lines in prose.
	cmdRE := regexp.MustCompile("`deskway\\s+bench\\s+faults\\s+--scenario\\s+([^`]*)`")
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range cmdRE.FindAllStringSubmatch(string(b), -1) {
			seen++
			line := strings.Join(strings.Fields("deskway bench faults --scenario "+m[1]), " ")
			args := strings.Fields(m[1])
			if _, err := Select(strings.Split(args[0], ",")); err != nil {
				t.Errorf("%s: %s: %v", f, line, err)
			}
			for i, a := range args {
				if a != "--out" || i+1 >= len(args) {
					continue
				}
				res, err := os.ReadFile(filepath.Join(root, args[i+1], "result.md"))
				if err != nil {
					t.Errorf("%s: %s: %v", f, line, err)
					continue
				}
				if !strings.Contains(string(res), "`"+line+"`") {
					t.Errorf("%s shows `%s`, which is not the command %s/result.md says made it", f, line, args[i+1])
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no `deskway bench faults` command found in the docs")
	}
}

// TestFaultsTableIsOneRun: docs/benchmarks/faults/README.md shows the
// table of one run of `deskway bench faults`: it names one command, the
// one docs/benchmarks/faults/result.md says it ran, and every row of its
// table is a row of that result.md's table as the bench wrote it, so no
// row can come from another run or be edited by hand.
func TestFaultsTableIsOneRun(t *testing.T) {
	dir := "../../../docs/benchmarks/faults"
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := os.ReadFile(filepath.Join(dir, "result.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := regexp.MustCompile("`deskway bench faults [^`]*`").FindAllString(string(readme), -1)
	if uniq := slices.Compact(slices.Sorted(slices.Values(cmds))); len(uniq) != 1 {
		t.Fatalf("README.md names %d commands, want the one that made its table: %q", len(uniq), uniq)
	}
	if !strings.Contains(string(res), cmds[0]) {
		t.Errorf("README.md names %s; result.md was made by another command", cmds[0])
	}
	rows := 0
	for _, line := range strings.Split(string(readme), "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| scenario |") {
			continue
		}
		rows++
		if !strings.Contains(string(res), "\n"+line+"\n") {
			t.Errorf("README.md's row is not in result.md's table: %s", line)
		}
	}
	if rows == 0 {
		t.Error("README.md has no table rows")
	}
}
