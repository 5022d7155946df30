package kernelgre

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedUpToDate runs gen.go's go:generate line into a scratch
// directory and compares its output with the committed files, so the
// object and its Go side cannot drift from bpf/gre.c.
func TestGeneratedUpToDate(t *testing.T) {
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for l := range strings.SplitSeq(string(src), "\n") {
		if rest, ok := strings.CutPrefix(l, "//go:generate "); ok {
			args = splitQuoted(rest)
		}
	}
	if len(args) < 2 || args[0] != "go" {
		t.Fatalf("gen.go has no go:generate line running go: %q", args)
	}
	dir := t.TempDir()
	args = append(args[:3], append([]string{"-output-dir", dir}, args[3:]...)...)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "GOPACKAGE=kernelgre", "GOFILE=gen.go")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s\n(clang-14, llvm and libbpf-dev come with scripts/deps.sh)", strings.Join(args, " "), err, out)
	}
	for _, f := range []string{"gre_bpfel.o", "gre_bpfel.go"} {
		want, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what bpf/gre.c compiles to: run go generate ./internal/site/kernelgre/ and commit it", f)
		}
	}
}

// splitQuoted splits a go:generate line into words, as go generate
// does: spaces separate them, double quotes group.
func splitQuoted(s string) []string {
	var words []string
	var cur strings.Builder
	in, have := false, false
	for _, r := range s {
		switch {
		case r == '"':
			in, have = !in, true
		case r == ' ' && !in:
			if have {
				words = append(words, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		words = append(words, cur.String())
	}
	return words
}
