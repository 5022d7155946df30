package xrdphost

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBenchConfigsNameTheirAdminListener: every deskway config a bench
// writes (a Go raw string starting "state_dir:", in any package under
// internal/bench) names its admin listener: a port the bench chose, or
// the default's inside a network namespace of the bench's. Left out, the admin API took
// the default 127.0.0.1:9443, which an installed deskway holds: the
// time-to-first-frame, session host and browser benches could not start
// beside one, and a test of the Debian package running beside the first
// found 9443 taken.
func TestBenchConfigsNameTheirAdminListener(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "*", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := regexp.MustCompile("`(state_dir:[^`]*)`")
	admin := regexp.MustCompile(`(?m)^admin: \{listen: "`)
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range tmpl.FindAllStringSubmatch(string(b), -1) {
			seen++
			if !admin.MatchString(m[1]) {
				t.Errorf("%s: a config that leaves admin.listen to its default, 127.0.0.1:9443:\n%s", f, m[1])
			}
		}
	}
	if seen < 3 {
		t.Fatalf("found %d bench configs; the ttff, session host and browser benches write some", seen)
	}
}
