package web_test

import (
	"bytes"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSignOutLoopStaysSmall: one account signing in and out in a loop
// (300 times, a second apart) keeps STATE_DIR/web-signouts small, and
// every one of its old cookies stays refused, also after a restart; a
// new sign-in works.
func TestSignOutLoopStaysSmall(t *testing.T) {
	p := newPortal(t)
	const n = 300
	var old []*http.Cookie
	for i := range n {
		c := p.signIn("bob", "Bob-Pass-1")
		m := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, c, nil)))
		if m == nil {
			t.Fatalf("cycle %d: no form on bob's page", i)
		}
		if r := p.do("POST", "/signout", url.Values{"csrf": {m[1]}}, c, nil); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("cycle %d: sign-out: %s", i, r.Status)
		}
		old = append(old, c)
		p.clock.add(time.Second)
	}
	b, err := os.ReadFile(filepath.Join(p.stateDir, "web-signouts"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Count(b, []byte("\n"))
	t.Logf("%d sign-outs of one account: web-signouts holds %d lines, %d bytes", n, lines, len(b))
	if lines > 150 {
		t.Errorf("%d sign-outs of one account left %d lines in web-signouts", n, lines)
	}
	for _, when := range []string{"", " after a restart"} {
		if when != "" {
			p.restart()
		}
		for i, c := range old {
			if r := p.do("GET", "/", nil, c, nil); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/signin" {
				t.Fatalf("bob's cookie of cycle %d, signed out, is accepted%s: %s", i, when, r.Status)
			}
		}
	}
	p.clock.add(time.Second)
	if body := read(p.do("GET", "/", nil, p.signIn("bob", "Bob-Pass-1"), nil)); !bytes.Contains([]byte(body), []byte("Signed in as <strong>bob</strong>")) {
		t.Fatalf("bob's new sign-in:\n%s", body)
	}
}
