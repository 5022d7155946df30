package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/deskway/deskway/internal/testkit"
)

// internalText is what text written for programs looks like: source
// paths and the client's error markers, protocol and I/O errors, the
// broker's words for administrators, and Go's wrapped errors ("a: b c:
// d"). No page a person reads may show any of it.
var internalText = regexp.MustCompile(`crates/|@ |: EOF|read frame|not enough bytes|UserRequested|delivery group "|draining|\w: [\w ]+: \w`)

// testBrowserEndsInWords walks a person through every way a browser
// desktop ends, and a launch refused, and reads each page: a launch onto
// a drained group, the tunnel cut by an administrator, an
// administrator's disconnect, the user's own logoff (Ctrl+D ends the
// session's only program, as exit ends a shell), and signing out. Each
// says what happened in a sentence and none shows an internal string.
func testBrowserEndsInWords(t *testing.T, xs testkit.XRDPSetup) {
	ctx := newBrowser(t)
	b := newBrowserRig(t, xs)
	b.signIn(t, ctx)
	admin := func(method, path, body string, out any) {
		t.Helper()
		req, _ := http.NewRequest(method, fmt.Sprintf("https://127.0.0.1:%d%s", b.adminPort, path), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer e2e-admin-token")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := b.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %s", method, path, resp.Status)
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatal(err)
			}
		}
	}
	plain := func(tab context.Context, name string) string {
		t.Helper()
		text, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.body.innerText`))
		if err != nil {
			t.Fatal(err)
		}
		shot(t, tab, b.artifacts, name)
		if m := internalText.FindString(text); m != "" {
			t.Errorf("%s: the page shows %q:\n%s", name, m, text)
		}
		return text
	}
	endsWith := func(tab context.Context, name, want string) {
		t.Helper()
		wait, cancel := context.WithTimeout(tab, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(wait, chromedp.WaitVisible(chromedp.ID("ended"))); err != nil {
			t.Fatalf("%s: the page shows no end: %v", name, err)
		}
		// The page asks the portal why before it says so.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			msg, err := chromedp.Run(tab, chromedp.Text(chromedp.ID("status")))
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(msg, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the page says %q, want %q", name, msg, want)
			}
		}
		plain(tab, name)
	}
	connect := func() context.Context {
		t.Helper()
		tab := b.openInBrowser(t, ctx)
		connectInBrowser(t, tab, b.xrdp.User, b.xrdp.Password, b.artifacts, b.gwLog)
		return tab
	}

	// A drained group: the launch is refused in words.
	admin("POST", "/api/v1/broker/hosts/xrdp-host/drain", `{"drain": true}`, nil)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("li.desktop[data-group='desk'] button:not([formaction])")),
		chromedp.WaitVisible(chromedp.CSS(".error"))); err != nil {
		t.Fatal(err)
	}
	if msg, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(".error"))); msg != "No desk desktop is free right now. Try again in a few minutes; if it keeps happening, tell your administrator." {
		t.Errorf("a launch onto a drained group says %q", msg)
	}
	plain(ctx, "words-1-drained-launch")
	admin("POST", "/api/v1/broker/hosts/xrdp-host/undrain", "", nil)
	if err := chromedp.Do(ctx, chromedp.Navigate(b.portal+"/"), chromedp.WaitVisible(chromedp.CSS("li.desktop[data-group='desk']"))); err != nil {
		t.Fatal(err)
	}

	// The tunnel cut by an administrator: the connection is lost, the
	// session lives on.
	tab := connect()
	var tl struct{ Tunnels []struct{ ID uint32 } }
	admin("GET", "/api/v1/gateway/tunnels", "", &tl)
	if len(tl.Tunnels) != 1 {
		t.Fatalf("tunnels: %+v", tl.Tunnels)
	}
	admin("DELETE", fmt.Sprintf("/api/v1/gateway/tunnels/%d", tl.Tunnels[0].ID), "", nil)
	endsWith(tab, "words-2-tunnel-cut", "The connection to the desktop was lost.")

	// An administrator's disconnect.
	tab = connect()
	b.waitState("active")
	var ss []struct{ ID string }
	admin("GET", "/api/v1/broker/sessions?user="+b.xrdp.User, "", &ss)
	admin("POST", "/api/v1/broker/sessions/"+ss[0].ID+"/disconnect", "{}", nil)
	endsWith(tab, "words-3-admin-disconnect", "An administrator disconnected you from the desktop.")

	// The user ends the session's only program (Ctrl+D ends its cat):
	// the session ends, as exit in a shell ends it.
	tab = connect()
	ctrl := int64(chromedp.ModifierCtrl)
	keys := []input.DispatchKeyEventParams{
		{Type: input.DispatchKeyEventTypeRawKeyDown, Key: "Control", Code: "ControlLeft", WindowsVirtualKeyCode: 17, Modifiers: ctrl},
		{Type: input.DispatchKeyEventTypeRawKeyDown, Key: "d", Code: "KeyD", WindowsVirtualKeyCode: 68, Modifiers: ctrl},
		{Type: input.DispatchKeyEventTypeKeyUp, Key: "d", Code: "KeyD", WindowsVirtualKeyCode: 68, Modifiers: ctrl},
		{Type: input.DispatchKeyEventTypeKeyUp, Key: "Control", Code: "ControlLeft", WindowsVirtualKeyCode: 17},
	}
	if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS("iron-remote-desktop")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			for _, k := range keys {
				if _, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, k); err != nil {
					return err
				}
			}
			return nil
		})); err != nil {
		t.Fatal(err)
	}
	endsWith(tab, "words-4-logged-off", "You logged off.")

	// Signing out says so.
	if err := chromedp.Do(ctx, chromedp.Navigate(b.portal+"/"), chromedp.Click(chromedp.CSS("form.signout button")),
		chromedp.WaitVisible(chromedp.CSS(".notice"))); err != nil {
		t.Fatal(err)
	}
	if msg, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(".notice"))); msg != "Signed out." {
		t.Errorf("after Sign out the page says %q", msg)
	}
	plain(ctx, "words-5-signed-out")
}
