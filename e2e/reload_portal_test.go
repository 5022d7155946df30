package e2e

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// reloadPortalConfig is the package's shape: a broker and the portal in
// one process; %[4]s is the user list.
const reloadPortalConfig = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: [admin-tok]}
auth:
  token_key: reload-test-key-0123456789abcdef0123456789
  users:
%[4]s
broker:
  listen: "127.0.0.1:%[3]d"
  gateway: "gateway.example.test:443"
  frontend_tokens: [portal-tok]
  delivery_groups:
  - {name: desk, groups: [staff]}
web:
  listen: "127.0.0.1:%[5]d"
`

// TestReloadPutsUsersInForceAtThePortal: deskway init's advice is to add
// a user to auth.users and systemctl reload deskway (SIGHUP). The portal
// of that process must sign in the user added, and no longer the user
// removed, without a restart.
func TestReloadPutsUsersInForceAtThePortal(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	adminPort, brokerPort, webPort := testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
	cfg := filepath.Join(dir, "deskway.yaml")
	write := func(users string) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(reloadPortalConfig, filepath.Join(dir, "state"), adminPort, brokerPort, users, webPort)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	alice := `  - {name: alice, password: "Alice-Pass1", groups: [staff]}`
	zoe := `  - {name: zoe, password: "Zoe-Pass1", groups: [staff]}`
	write(alice)
	p := testkit.Start(t, nil, bin, "run", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", webPort), 15*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, p.Log.String())
	}
	signIn := func(user, pass string) int {
		t.Helper()
		c := &http.Client{
			Timeout:       10 * time.Second,
			Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
		resp, err := c.PostForm(fmt.Sprintf("https://127.0.0.1:%d/signin", webPort), url.Values{"user": {user}, "password": {pass}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := signIn("alice", "Alice-Pass1"); code != http.StatusSeeOther {
		t.Fatalf("alice at the portal: %d, want 303", code)
	}
	if code := signIn("zoe", "Zoe-Pass1"); code != http.StatusUnauthorized {
		t.Fatalf("zoe at the portal before she is added: %d, want 401", code)
	}

	write(zoe) // alice removed, zoe added
	if err := syscall.Kill(p.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(p.Log.String(), "configuration reloaded"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no reload in the log:\n%s", p.Log.String())
		}
	}
	if code := signIn("zoe", "Zoe-Pass1"); code != http.StatusSeeOther {
		t.Errorf("zoe at the portal after she was added and the config reloaded: %d, want 303", code)
	}
	if code := signIn("alice", "Alice-Pass1"); code != http.StatusUnauthorized {
		t.Errorf("alice at the portal after she was removed and the config reloaded: %d, want 401", code)
	}
}
