package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/config"
)

// internalWords are the marks of text written for programs or
// administrators, which no page a user sees may show.
var internalWords = regexp.MustCompile(`crates/|@ |: EOF|read frame|delivery group "|draining|unhealthy|\w: \w+ \w+: `)

// TestLaunchRefusalInPlainWords: a launch the broker turns away because
// the only host drains reads as a sentence a person can act on; the
// broker's own explanation stays in the log.
func TestLaunchRefusalInPlainWords(t *testing.T) {
	p := newPortal(t)
	if _, err := p.agent.Heartbeat(context.Background(), p.hostCred, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9, Drain: true, Sessions: []brokerapi.Session{}}); err != nil {
		t.Fatal(err)
	}
	c := p.signIn("alice", "Alice-Pass-1")
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, c, nil)))[1]
	body := read(p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, c, nil))
	msg := regexp.MustCompile(`<p class="error" role="alert">([^<]*)</p>`).FindStringSubmatch(body)
	if msg == nil || msg[1] != "No desk desktop is free right now. Try again in a few minutes; if it keeps happening, tell your administrator." {
		t.Fatalf("a launch onto a drained host shows %q", msg)
	}
	if internalWords.MatchString(body) {
		t.Fatalf("the page shows the broker's internals: %s", internalWords.FindString(body))
	}
}

// TestBrowserEndInWords: the browser page's question after its
// connection ends is answered from what the broker knows: the user's own
// logoff inside the session, an administrator's disconnect from the
// console (which asks first), and a connection lost with the session
// still live.
func TestBrowserEndInWords(t *testing.T) {
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		w.Console = &config.Console{Admins: []string{"staff"}, Token: config.NewSecret("console-admin-token")}
		return nil
	})
	ctx := context.Background()
	c := p.signIn("alice", "Alice-Pass-1")
	beat := func(ss ...brokerapi.Session) brokerapi.HeartbeatResponse {
		t.Helper()
		cmds, err := p.agent.Heartbeat(ctx, p.hostCred, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9, Sessions: append([]brokerapi.Session{}, ss...)})
		if err != nil {
			t.Fatal(err)
		}
		return brokerapi.HeartbeatResponse{Commands: cmds}
	}
	launch := func() string {
		t.Helper()
		csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, c, nil)))[1]
		if r := p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, c, nil); r.StatusCode != http.StatusOK {
			t.Fatalf("launch: %s", r.Status)
		}
		beat(brokerapi.Session{User: "alice", State: "active"})
		m := regexp.MustCompile(`name="session" value="([^"]+)"`).FindStringSubmatch(read(p.do("GET", "/", nil, c, nil)))
		if m == nil {
			t.Fatal("the desktops page offers no logoff of the running session")
		}
		return m[1]
	}
	// ended asks as the page opened at opened asks when its connection
	// ends.
	ended := func(id string, opened time.Time) string {
		t.Helper()
		csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, c, nil)))[1]
		r := p.do("POST", "/browser/end", url.Values{"csrf": {csrf}, "session": {id}, "opened": {strconv.FormatInt(opened.UnixMilli(), 10)},
			"detail": {"[connector error @ crates/ironrdp-session/src/lib.rs:98] UserRequested"}}, c, nil)
		var out struct{ Message string }
		if err := json.NewDecoder(r.Body).Decode(&out); err != nil || r.StatusCode != http.StatusOK {
			t.Fatalf("/browser/end: %s %v", r.Status, err)
		}
		if internalWords.MatchString(out.Message) {
			t.Fatalf("the end reads %q", out.Message)
		}
		return out.Message
	}

	// exit in the session: the host reports it gone.
	id := launch()
	beat()
	if m := ended(id, time.Now()); m != "You logged off. The session has ended." {
		t.Fatalf("after the user's own logoff the page says %q", m)
	}
	// The connection lost (a tunnel cut, a network gone): the session
	// lives on, and no command ended it.
	opened := time.Now()
	id = launch()
	start := time.Now()
	if m := ended(id, opened); !strings.HasPrefix(m, "The connection to the desktop was lost.") {
		t.Fatalf("after a lost connection the page says %q", m)
	}
	if took := time.Since(start); took > 6*time.Second {
		t.Fatalf("the answer took %v", took)
	}
	// An administrator's disconnect, confirmed in the console; the
	// host's agent takes it with its next heartbeat.
	form := url.Values{"csrf": {csrfField.FindStringSubmatch(read(p.do("GET", "/admin/sessions", nil, c, nil)))[1]}, "user": {"alice"}, "host": {"h1"}}
	ask := read(p.do("POST", "/admin/sessions/"+id+"/disconnect", form, c, nil))
	if !strings.Contains(ask, "<h1>Disconnect alice from h1?</h1>") || !strings.Contains(ask, `name="confirmed" value="yes"`) {
		t.Fatalf("Disconnect did not ask first:\n%s", ask)
	}
	form.Set("confirmed", "yes")
	if r := p.do("POST", "/admin/sessions/"+id+"/disconnect", form, c, nil); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("confirmed disconnect: %s %s", r.Status, read(r))
	}
	if hb := beat(brokerapi.Session{User: "alice", State: "active"}); len(hb.Commands) != 1 || hb.Commands[0].Kind != brokerapi.Disconnect {
		t.Fatalf("the host was handed %+v", hb.Commands)
	}
	beat(brokerapi.Session{User: "alice", State: "disconnected"})
	if m := ended(id, opened); !strings.HasPrefix(m, "An administrator disconnected you") {
		t.Fatalf("after the administrator's disconnect the page says %q", m)
	}
	// The user reconnects, then logs off: the earlier disconnect ended
	// the earlier connection, not this one.
	time.Sleep(5 * time.Millisecond) // the command's millisecond is before the reopening's
	opened = time.Now()
	if again := launch(); again != id {
		t.Fatalf("the reconnect is to session %s, want %s", again, id)
	}
	beat()
	if m := ended(id, opened); m != "You logged off. The session has ended." {
		t.Fatalf("after a reconnect and the user's own logoff the page says %q", m)
	}
}

// TestAdminWithoutDesktopsLandsOnConsole: an administrator entitled to
// no desktop is taken to the console, not told to ask an administrator;
// a user with neither still reads what to do.
func TestAdminWithoutDesktopsLandsOnConsole(t *testing.T) {
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		w.Console = &config.Console{Admins: []string{"visitors"}, Token: config.NewSecret("console-admin-token")}
		return nil
	})
	r := p.do("GET", "/", nil, p.signIn("bob", "Bob-Pass-1"), nil)
	if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/admin/" {
		t.Fatalf("bob (an admin with no desktop) lands on %s %q", r.Status, r.Header.Get("Location"))
	}
	if body := read(p.do("GET", "/", nil, p.signIn("alice", "Alice-Pass-1"), nil)); !strings.Contains(body, `data-group="desk"`) {
		t.Fatalf("alice (desktops, no console role) sees:\n%s", body)
	}
}

// TestBrowserPass: after the desktop refused a logon, the browser page
// gets a new pass to it from the portal, as JSON, and a refused launch
// in words; without the sign-in's form token it gets nothing.
func TestBrowserPass(t *testing.T) {
	p := newPortal(t)
	c := p.signIn("alice", "Alice-Pass-1")
	if _, err := p.agent.Heartbeat(context.Background(), p.hostCred, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9, Sessions: []brokerapi.Session{}}); err != nil {
		t.Fatal(err)
	}
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, c, nil)))[1]
	pass := func(form url.Values) map[string]string {
		t.Helper()
		r := p.do("POST", "/browser/pass", form, c, nil)
		var out map[string]string
		if err := json.NewDecoder(r.Body).Decode(&out); err != nil || r.StatusCode != http.StatusOK {
			t.Fatalf("/browser/pass: %s %v", r.Status, err)
		}
		return out
	}
	got := pass(url.Values{"delivery_group": {"desk"}, "csrf": {csrf}})
	for _, k := range []string{"token", "gateway", "destination", "session", "opened"} {
		if got[k] == "" {
			t.Fatalf("the new pass has no %s: %v", k, got)
		}
	}
	if !strings.HasPrefix(got["gateway"], "wss://") || !strings.HasSuffix(got["gateway"], "/rdp") {
		t.Fatalf("the new pass's gateway is %q", got["gateway"])
	}
	if got := pass(url.Values{"delivery_group": {"nothing"}, "csrf": {csrf}}); got["token"] != "" || got["message"] == "" || internalWords.MatchString(got["message"]) {
		t.Fatalf("a refused launch answers %v", got)
	}
	if r := p.do("POST", "/browser/pass", url.Values{"delivery_group": {"desk"}}, c, nil); r.StatusCode == http.StatusOK {
		t.Fatalf("/browser/pass without the form token: %s", r.Status)
	}
}
