package e2e

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

const reloadConfig = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: [admin-tok]}
auth:
  token_key: reload-test-key-0123456789abcdef0123456789
  users:
  - {name: alice, password: "Alice-Pass1", groups: [staff]}
%[5]s
gateway:
  listen: "127.0.0.1:%[3]d"
  connection_policies: [{name: staff, groups: [staff]}]
  resource_policies: [{name: hosts, groups: [staff], hosts: [127.0.0.1]}]
broker:
  listen: "127.0.0.1:%[4]d"
  gateway: "127.0.0.1:%[3]d"
  delivery_groups:
  - {name: desk, groups: [staff]}
`

// TestReloadWithoutRestart: SIGHUP, and the admin API's reload, put a
// changed user list in force in the running process; a file with a
// mistake changes nothing and the log and the answer say what is wrong.
func TestReloadWithoutRestart(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	adminPort, gwPort, brokerPort := testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
	cfg := filepath.Join(dir, "deskway.yaml")
	write := func(extra string) {
		t.Helper()
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(reloadConfig, filepath.Join(dir, "state"), adminPort, gwPort, brokerPort, extra)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	p := testkit.Start(t, nil, bin, "run", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", brokerPort), 15*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, p.Log.String())
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	launch := func(user, pass string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/launch", brokerPort), strings.NewReader(`{"delivery_group":"desk"}`))
		req.SetBasicAuth(user, pass)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitLog := func(what string, n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); strings.Count(p.Log.String(), what) < n; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log:\n%s", what, p.Log.String())
			}
		}
	}
	if code, body := launch("zoe", "Zoe-Pass1"); code != http.StatusUnauthorized {
		t.Fatalf("zoe before she is added: %d %s", code, body)
	}
	// zoe is added to the file; SIGHUP puts her in force. With no session
	// host registered her launch finds no host: she got past sign-in and
	// the entitlement.
	write("  - {name: zoe, password: \"Zoe-Pass1\", groups: [staff]}")
	if err := syscall.Kill(p.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("configuration reloaded", 1)
	if code, body := launch("zoe", "Zoe-Pass1"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no host") {
		t.Fatalf("zoe after the reload: %d %s", code, body)
	}
	// A mistake in the file: nothing changes, and the log says what.
	if err := os.WriteFile(cfg, []byte(strings.Replace(fmt.Sprintf(reloadConfig, filepath.Join(dir, "state"), adminPort, gwPort, brokerPort, ""), "listen:", "lissen:", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("configuration reload refused", 1)
	if !strings.Contains(p.Log.String(), "lissen") {
		t.Fatalf("the refusal does not name the mistake:\n%s", p.Log.String())
	}
	if code, body := launch("zoe", "Zoe-Pass1"); code != http.StatusServiceUnavailable {
		t.Fatalf("zoe after a refused reload: %d %s", code, body)
	}
	// The admin API's reload answers with the reason.
	req, _ := http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/reload", adminPort), nil)
	req.Header.Set("Authorization", "Bearer admin-tok")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "lissen") {
		t.Fatalf("admin reload of a broken file: %d %s", resp.StatusCode, b)
	}
	// Fixed, without zoe: the admin API's reload takes her out.
	write("")
	req, _ = http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/reload", adminPort), nil)
	req.Header.Set("Authorization", "Bearer admin-tok")
	if resp, err = client.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("admin reload: %v %v", resp, err)
	}
	resp.Body.Close()
	if code, body := launch("zoe", "Zoe-Pass1"); code != http.StatusUnauthorized {
		t.Fatalf("zoe after she was removed: %d %s", code, body)
	}
	// Both admin reloads are in the audit trail, in the broker's
	// database: who (which admin token), what, from where, the answer.
	req, _ = http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/api/v1/audit?limit=10", adminPort), nil)
	req.Header.Set("Authorization", "Bearer admin-tok")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var trail struct {
		Entries []struct {
			Actor, Action, Source string
			Status                int
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&trail); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(trail.Entries) != 2 || trail.Entries[0].Status != http.StatusOK || trail.Entries[1].Status != http.StatusBadRequest {
		t.Fatalf("audit trail: %+v", trail.Entries)
	}
	for _, e := range trail.Entries {
		if e.Actor != "admin token 1" || e.Action != "POST /api/v1/reload" || !strings.HasPrefix(e.Source, "127.0.0.1:") {
			t.Fatalf("audit entry: %+v", e)
		}
	}
	if !strings.Contains(p.Log.String(), `"msg":"admin action"`) {
		t.Fatalf("admin actions are not logged:\n%s", p.Log.String())
	}
	// A request with a wrong token is refused, and the log says so.
	req, _ = http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/reload", adminPort), nil)
	req.Header.Set("Authorization", "Bearer guess")
	if resp, err = client.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("reload with a wrong token: %v %v", resp, err)
	}
	resp.Body.Close()
	waitLog("admin API refused a request", 1)
	// A changed admin token takes a restart: the reload is refused, not
	// reported done while the old token goes on working.
	if err := os.WriteFile(cfg, []byte(strings.Replace(fmt.Sprintf(reloadConfig, filepath.Join(dir, "state"), adminPort, gwPort, brokerPort, ""), "tokens: [admin-tok]", "tokens: [new-tok]", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("configuration reload refused", 3) // after the SIGHUP and the admin API refusals above
	if !strings.Contains(p.Log.String(), "admin.tokens changed, which takes a restart") {
		t.Fatalf("the refusal does not say the token needs a restart:\n%s", p.Log.String())
	}
}
