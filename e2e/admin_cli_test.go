package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// TestHostAndSessionCommands runs the administrator's commands against a
// running deskway, as written in the README: hosts listed, drained and
// undrained, a stale session record ended, a host removed; each shows in
// the listings and in the audit trail.
func TestHostAndSessionCommands(t *testing.T) {
	// Ports the kernel chose; the host it lists is a record, not a
	// listener.
	parallel(t)
	bin := build(t)
	dir := t.TempDir()
	adminPort, gwPort, brokerPort := testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
	cfg := filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(reloadConfig, filepath.Join(dir, "state"), adminPort, gwPort, brokerPort, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testkit.Start(t, nil, bin, "run", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", adminPort), 15*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, p.Log.String())
	}
	deskway := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append(args, "-c", cfg)...).CombinedOutput()
		if err != nil {
			t.Fatalf("deskway %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// A host joins with a join token from the CLI, and alice launches.
	join := strings.TrimSpace(deskway("token", "join", "--group", "desk", "--uses", "1"))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	post := func(path, bearer, user, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d%s", brokerPort, path), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		} else {
			req.SetBasicAuth(user, "Alice-Pass1")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := post("/api/v1/agent/register", join, "", `{"name":"h1","address":"127.0.0.1","port":3389}`)
	var reg struct{ Credential string }
	if err := json.NewDecoder(resp.Body).Decode(&reg); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("register: %s %v", resp.Status, err)
	}
	resp.Body.Close()
	resp = post("/api/v1/agent/heartbeat", reg.Credential, "", `{"host":"h1","disk_idle":0.9,"sessions":[]}`)
	resp.Body.Close()
	resp = post("/api/v1/launch", "", "alice", `{"delivery_group":"desk"}`)
	var launched struct {
		SessionID string `json:"session_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&launched); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("launch: %s %v", resp.Status, err)
	}
	resp.Body.Close()

	if out := deskway("host", "ls"); !regexp.MustCompile(`(?m)^h1\s+desk\s+127\.0\.0\.1:3389\s+1/\d+\s+\d+%\s+ok`).MatchString(out) {
		t.Fatalf("host ls:\n%s", out)
	}
	deskway("host", "drain", "h1")
	if out := deskway("host", "ls"); !strings.Contains(out, "draining") {
		t.Fatalf("host ls after drain:\n%s", out)
	}
	if out := deskway("session", "ls"); !strings.Contains(out, launched.SessionID) || !strings.Contains(out, "alice") {
		t.Fatalf("session ls:\n%s", out)
	}
	deskway("session", "end", launched.SessionID)
	if out := deskway("session", "ls"); strings.Contains(out, launched.SessionID) {
		t.Fatalf("session ls after end:\n%s", out)
	}
	deskway("host", "undrain", "h1")
	if out := deskway("host", "ls"); !regexp.MustCompile(`(?m)^h1\s.*\s0/\d+\s.*ok`).MatchString(out) {
		t.Fatalf("host ls after the session ended and the drain:\n%s", out)
	}
	deskway("host", "remove", "h1")
	if out := deskway("host", "ls"); strings.Contains(out, "h1") {
		t.Fatalf("host ls after remove:\n%s", out)
	}
	// An error names what went wrong.
	out, err := exec.Command(bin, "host", "remove", "nosuch", "-c", cfg).CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte(`no host named "nosuch"`)) {
		t.Fatalf("removing a host that does not exist: %v\n%s", err, out)
	}
	// Who may launch a delivery group is set and cleared from the CLI.
	if out := deskway("group", "ls"); !regexp.MustCompile(`(?m)^desk\s+pooled\s+-\s+staff\s+configuration$`).MatchString(out) {
		t.Fatalf("group ls:\n%s", out)
	}
	if out := deskway("group", "entitle", "desk", "--user", "alice", "--group", "staff"); !strings.Contains(out, "desk: users alice, groups staff (from the admin API)") {
		t.Fatalf("group entitle:\n%s", out)
	}
	if out := deskway("group", "ls"); !regexp.MustCompile(`(?m)^desk\s+pooled\s+alice\s+staff\s+admin \(admin token 1\)$`).MatchString(out) {
		t.Fatalf("group ls after entitle:\n%s", out)
	}
	if out, err := exec.Command(bin, "group", "entitle", "desk", "-c", cfg).CombinedOutput(); err == nil || !bytes.Contains(out, []byte("--configured")) {
		t.Fatalf("group entitle with no names: %v\n%s", err, out)
	}
	if out := deskway("group", "entitle", "desk", "--configured"); !strings.Contains(out, "desk: users -, groups staff (from the configuration)") {
		t.Fatalf("group entitle --configured:\n%s", out)
	}
	// Every change is in the audit trail.
	req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/api/v1/audit", adminPort), nil)
	req.Header.Set("Authorization", "Bearer admin-tok")
	if resp, err = client.Do(req); err != nil {
		t.Fatal(err)
	}
	var trail struct{ Entries []struct{ Action string } }
	if err := json.NewDecoder(resp.Body).Decode(&trail); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var actions []string
	for _, e := range trail.Entries {
		actions = append(actions, e.Action)
	}
	got := strings.Join(actions, "\n")
	for _, want := range []string{"DELETE /api/v1/broker/hosts/nosuch", "DELETE /api/v1/broker/hosts/h1", "POST /api/v1/broker/hosts/h1/drain",
		"POST /api/v1/broker/hosts/h1/undrain",
		"DELETE /api/v1/broker/sessions/" + launched.SessionID, "PUT /api/v1/broker/groups/desk/entitlements", "DELETE /api/v1/broker/groups/desk/entitlements"} {
		if !strings.Contains(got, want) {
			t.Fatalf("audit trail lacks %s:\n%s", want, got)
		}
	}
}
