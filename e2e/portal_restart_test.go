package e2e

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// TestPortalSignOutAndAuditAcrossRestart runs deskway with the portal
// and its console: a copy of a cookie signed out stays refused after
// deskway restarts; an admin token that says it acts for a console user
// is audited as the token, while the console's own actions name the
// person.
func TestPortalSignOutAndAuditAcrossRestart(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	adminPort, gwPort, brokerPort, webPort := testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
	body := fmt.Sprintf(reloadConfig, filepath.Join(dir, "state"), adminPort, gwPort, brokerPort, "")
	body = strings.Replace(body, "broker:\n", "broker:\n  frontend_tokens: [e2e-portal-token]\n", 1) +
		fmt.Sprintf("web:\n  listen: \"127.0.0.1:%d\"\n  console: {admins: [staff]}\n", webPort)
	cfg := filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func() *testkit.Process {
		t.Helper()
		p := testkit.Start(t, nil, bin, "run", "-c", cfg)
		if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", webPort), 20*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, p.Log.String())
		}
		return p
	}
	p := start()
	portal := fmt.Sprintf("https://127.0.0.1:%d", webPort)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, form url.Values, c *http.Cookie) (*http.Response, string) {
		t.Helper()
		var rd io.Reader
		if form != nil {
			rd = strings.NewReader(form.Encode())
		}
		req, _ := http.NewRequest(method, portal+path, rd)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Sec-Fetch-Site", "same-origin")
		}
		if c != nil {
			req.AddCookie(c)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	signIn := func() *http.Cookie {
		t.Helper()
		resp, b := do("POST", "/signin", url.Values{"user": {"alice"}, "password": {"Alice-Pass1"}}, nil)
		for _, c := range resp.Cookies() {
			if c.Name == "__Host-deskway" && c.Value != "" {
				return c
			}
		}
		t.Fatalf("sign-in: %s\n%s", resp.Status, b)
		return nil
	}
	csrfOf := func(c *http.Cookie) string {
		t.Helper()
		_, b := do("GET", "/", nil, c)
		m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(b)
		if m == nil {
			t.Fatalf("no CSRF token on the page:\n%s", b)
		}
		return m[1]
	}
	copied := signIn()
	if resp, _ := do("POST", "/signout", url.Values{"csrf": {csrfOf(copied)}}, copied); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-out: %s", resp.Status)
	}
	refused := func(when string) {
		t.Helper()
		if resp, _ := do("GET", "/", nil, copied); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/signin" {
			t.Fatalf("%s the signed-out cookie opens the portal: %s", when, resp.Status)
		}
	}
	refused("before the restart")

	// The console's action is audited with the person's name.
	alice := signIn()
	if resp, b := do("POST", "/admin/hosts/no-such-host/drain", url.Values{"csrf": {csrfOf(alice)}}, alice); resp.StatusCode != http.StatusBadGateway || !strings.Contains(b, "Not done") {
		t.Fatalf("the console's drain of an unknown host: %s\n%s", resp.Status, b)
	}
	// An admin token that says it acts for a console user is audited as
	// the token.
	admin := fmt.Sprintf("https://127.0.0.1:%d", adminPort)
	req, _ := http.NewRequest("POST", admin+"/api/v1/broker/hosts/no-such-host/drain", strings.NewReader(`{"drain":true}`))
	req.Header.Set("Authorization", "Bearer admin-tok")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Deskway-Actor", "admin, web console: root1")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ = http.NewRequest("GET", admin+"/api/v1/audit", nil)
	req.Header.Set("Authorization", "Bearer admin-tok")
	if resp, err = client.Do(req); err != nil {
		t.Fatal(err)
	}
	var audit struct {
		Entries []struct{ Actor, Action string }
	}
	err = json.NewDecoder(resp.Body).Decode(&audit)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var actors []string
	for _, e := range audit.Entries {
		actors = append(actors, e.Actor)
	}
	all := strings.Join(actors, "\n")
	if len(actors) != 2 || strings.Contains(all, "root1") || !strings.Contains(all, "console token 1 for admin, web console: alice") || !strings.Contains(all, "admin token 1") {
		t.Errorf("the audit trail's actors:\n%s", all)
	}

	// Restart: the sign-out still holds; other sign-ins are unaffected.
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGTERM)
	if err := p.Cmd.Wait(); err != nil {
		t.Fatalf("deskway did not stop cleanly: %v\n%s", err, lastLines(p.Log.String(), 20))
	}
	start()
	refused("after the restart")
	if resp, _ := do("GET", "/", nil, alice); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the restart alice's other sign-in: %s", resp.Status)
	}
}
