package faults

import (
	"os"
	"path/filepath"
	"regexp"
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
