package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/deskway/deskway/internal/testkit"
)

// refusedWords is what the browser desktop page says when the desktop
// refused the user name or password typed on its form.
const refusedWords = "The desktop refused that user name or password. Try again."

// testBrowserWrongPassword: a wrong password typed on the browser
// desktop's logon form (no single sign-on) is a sentence on the page and
// the form again, with a new pass from the portal, and the right password
// then logs on. Before, xrdp's own "login failed" dialog sat inside the
// desktop, the page said nothing, and the pass was spent. xrdp says
// nothing of a refused logon on the wire: the gateway waits for the
// session's channel server to speak on the clipboard channel
// (gateway.browser_logon_timeout, 10s here) and otherwise ends the
// session with a close code the page reads.
func testBrowserWrongPassword(t *testing.T, xs testkit.XRDPSetup) {
	ctx := newBrowser(t)
	b := newBrowserRigWith(t, xs, "clipboard", func(cfg string) string {
		return strings.Replace(cfg, "gateway:\n", "gateway:\n  browser_logon_timeout: 10s\n", 1)
	})
	b.signIn(t, ctx)
	tab := b.openInBrowser(t, ctx)
	mark := b.logMark()
	if err := chromedp.Do(tab,
		chromedp.Clear(chromedp.ID("username")),
		chromedp.SendKeys(chromedp.ID("username"), b.xrdp.User),
		chromedp.SendKeys(chromedp.ID("password"), "not-"+b.xrdp.Password),
		chromedp.Click(chromedp.CSS("#credentials button")),
	); err != nil {
		t.Fatal(err)
	}
	shown := `(() => {
		const s = document.getElementById('status');
		return [s.textContent, String(!document.getElementById('credentials').hidden), s.className];
	})()`
	var last []string
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		got, err := chromedp.Run(tab, chromedp.Evaluate[[]string](shown))
		if err == nil && len(got) == 3 && got[0] == refusedWords && got[1] == "true" {
			break
		}
		last = got
		if time.Now().After(deadline) {
			shot(t, tab, b.artifacts, "wrong-password-failed")
			t.Fatalf("the page shows %q (status, form shown, class), not %q and the form\n%s", last, refusedWords, lastLines(b.gwLog.Log.String()[mark:], 10))
		}
	}
	shot(t, tab, b.artifacts, "wrong-password")
	b.gatewayLogHas(t, mark, `ended as a refused logon`, `"transport":"browser"`)
	// The right password, on the same page: the desktop. The form keeps
	// the user name; connectInBrowser types it again.
	if _, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.getElementById('username').value = ''`)); err != nil {
		t.Fatal(err)
	}
	connectInBrowser(t, tab, b.xrdp.User, b.xrdp.Password, b.artifacts, b.gwLog)
	if status, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.getElementById('status').textContent`)); err != nil || status != "" {
		t.Fatalf("connected, the page still says %q (%v)", status, err)
	}
}
