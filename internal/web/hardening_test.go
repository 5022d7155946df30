package web_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// TestLogoffNoticeIsThePortals: a log off with made-up delivery_group
// text redirects to a notice in the portal's words, and the address it
// redirects to shows nothing of that text to another user.
func TestLogoffNoticeIsThePortals(t *testing.T) {
	p := newPortal(t)
	alice := p.signIn("alice", "Alice-Pass-1")
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, alice, nil)))[1]
	if r := p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, alice, nil); r.StatusCode != http.StatusOK {
		t.Fatalf("alice's launch: %s", r.Status)
	}
	if _, err := p.agent.Heartbeat(context.Background(), p.hostCred, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9,
		Sessions: []brokerapi.Session{{User: "alice", State: "active"}}}); err != nil {
		t.Fatal(err)
	}
	m := sessionField.FindStringSubmatch(read(p.do("GET", "/", nil, alice, nil)))
	if m == nil {
		t.Fatal("alice has no session to log off")
	}
	const lie = "Your account is locked. Call 0800 FRAUD"
	r := p.do("POST", "/logoff", url.Values{"csrf": {csrf}, "session": {m[1]}, "delivery_group": {lie}}, alice, nil)
	to := r.Header.Get("Location")
	if r.StatusCode != http.StatusSeeOther {
		t.Fatalf("logoff: %s", r.Status)
	}
	if strings.Contains(to, "0800") {
		t.Errorf("the logoff redirects to %q", to)
	}
	bob := p.signIn("bob", "Bob-Pass-1")
	body := read(p.do("GET", to, nil, bob, nil))
	if strings.Contains(body, "0800") {
		t.Fatalf("the logoff's notice address shows another user the request's words:\n%s", body)
	}
	if body := read(p.do("GET", to, nil, alice, nil)); !strings.Contains(body, "Logging off: the session&#39;s programs are being closed.") {
		t.Fatalf("alice's page after the logoff:\n%s", body)
	}
}

// TestSignOutSurvivesARestart: a copy of a cookie signed out is refused
// by the portal restarted on the same state directory, until the cookie
// would have expired; other sign-ins are not.
func TestSignOutSurvivesARestart(t *testing.T) {
	p := newPortal(t)
	copied := p.signIn("alice", "Alice-Pass-1")
	other := p.signIn("alice", "Alice-Pass-1")
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, copied, nil)))[1]
	if r := p.do("POST", "/signout", url.Values{"csrf": {csrf}}, copied, nil); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-out: %s", r.Status)
	}
	for i := range 3 {
		if i > 0 {
			p.restart()
		}
		if r := p.do("GET", "/", nil, copied, nil); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/signin" {
			t.Fatalf("after sign-out and %d restarts the copied cookie opens the page: %s", i, r.Status)
		}
		if r := p.do("GET", "/", nil, other, nil); r.StatusCode != http.StatusOK {
			t.Fatalf("after %d restarts another sign-in is refused: %s", i, r.Status)
		}
	}
}
