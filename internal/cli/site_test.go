package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// deskway site tunnels with a file that configures no site gateway says
// so in words, instead of the admin API's 404.
func TestSiteTunnelsNeedsASiteSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "deskway.yaml")
	if err := os.WriteFile(path, []byte("admin: {tokens: [t]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	code := Main(context.Background(), []string{"site", "tunnels", "-c", path}, io.Discard, &errb)
	if code == 0 || !strings.Contains(errb.String(), "has no site section, so the deskway it configures runs no site gateway to ask") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}
