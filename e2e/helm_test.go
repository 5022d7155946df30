package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/testkit"
)

// TestHelmChart: deploy/helm/deskway passes helm lint and helm template
// (Helm's own packages, in tools/chartcheck), every object it renders
// decodes strictly with the Kubernetes API types, values it cannot work
// with are refused with their reason, and the deskway configuration it
// writes for each role is one deskway itself accepts.
func TestHelmChart(t *testing.T) {
	out := t.TempDir()
	check := exec.Command("go", "run", ".", "-chart", "../../deploy/helm/deskway", "-out", out)
	check.Dir = "../tools/chartcheck"
	if b, err := check.CombinedOutput(); err != nil {
		t.Fatalf("chartcheck: %v\n%s", err, b)
	} else {
		t.Logf("%s", b)
	}
	bin := build(t)
	_, _, cert, key := testkit.TLS(t)
	for _, c := range []string{"defaults", "farm"} {
		roles, _ := filepath.Glob(filepath.Join(out, c, "*.yaml"))
		var n int
		for _, f := range roles {
			if filepath.Base(f) == "manifests.yaml" {
				continue
			}
			n++
			body, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			// What the pod mounts, here: the token key's file, the TLS
			// Secret, the state volume with a golden image in its store.
			state := t.TempDir()
			os.MkdirAll(filepath.Join(state, "store"), 0o755)
			os.WriteFile(filepath.Join(state, "store", "win11.img"), make([]byte, 1<<20), 0o644)
			tokenFile := filepath.Join(t.TempDir(), "token-key")
			os.WriteFile(tokenFile, []byte(strings.Repeat("k", 32)), 0o600)
			cfg := strings.NewReplacer("/etc/deskway/secrets/token-key", tokenFile,
				"/etc/deskway/tls/tls.crt", cert, "/etc/deskway/tls/tls.key", key,
				"/var/lib/deskway", state).Replace(string(body))
			path := filepath.Join(t.TempDir(), filepath.Base(f))
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			if b, err := exec.Command(bin, "config", "validate", path).CombinedOutput(); err != nil {
				t.Errorf("the chart's %s for %q is not a valid deskway configuration: %v\n%s\n%s", filepath.Base(f), c, err, b, cfg)
			}
		}
		if n == 0 {
			t.Fatalf("the %q case rendered no deskway configuration", c)
		}
	}
}
