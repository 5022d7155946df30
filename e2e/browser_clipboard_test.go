package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/testkit"
)

// slowClipboardAnswer makes the page's client answer its clipboard
// channel's start 15 seconds late: every clipboard offer the page makes
// waits that long. The client's channel becomes ready only when the
// host has answered the page's first offer, so for those seconds a host
// offer finds it not ready, as it does for a moment on any connection.
const slowClipboardAnswer = `(async () => {
	const m = await import('/static/vendor/iron-remote-desktop-rdp.js');
	const proto = m.Backend.SessionBuilder.prototype;
	const connect = proto.connect;
	proto.connect = async function () {
		const s = await connect.call(this);
		const sp = Object.getPrototypeOf(s);
		if (!sp.slowed) {
			const offer = sp.onClipboardPaste;
			sp.onClipboardPaste = async function (d) {
				await new Promise((r) => setTimeout(r, 15000));
				return offer.call(this, d);
			};
			sp.slowed = true;
		}
		return s;
	};
	return true;
})()`

// testBrowserClipboardOfferAtConnect: text copied in the session while
// the browser client's clipboard channel is still starting reaches the
// browser's clipboard, and the session goes on. Before, the host's
// offer went straight to the client, whose clipboard asked for the data
// on a channel not ready for it, and the client ended the session
// ("clipboard channel is not in Ready state"): the flake of
// testBrowserDesktopClipboardResizeKeys, whose copy comes right after
// the session's clipboard starts. The page's answer is slowed here so
// that the copy always lands in that moment.
func testBrowserClipboardOfferAtConnect(t *testing.T, xs testkit.XRDPSetup) {
	testkit.Require(t, "xclip", "xlsatoms")
	ctx := newBrowser(t)
	b := newBrowserRigRedirecting(t, xs, "clipboard")
	b.signIn(t, ctx)
	tab := b.openInBrowser(t, ctx)
	allowClipboard(t, tab, b.portal)
	if _, err := chromedp.Run(tab, chromedp.Evaluate[bool](slowClipboardAnswer, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatal(err)
	}
	connectInBrowser(t, tab, b.xrdp.User, b.xrdp.Password, b.artifacts, b.gwLog)
	s := newSessionX(t, b.xrdp.User)
	s.waitClipboardChannel(t)
	fromSession := "copied as the session starts " + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	s.copy(t, fromSession)
	eventually(t, 45*time.Second, "the browser's clipboard to hold the session's copy", func() (bool, string) {
		if ended, _ := chromedp.Run(tab, chromedp.Evaluate[bool](`!document.getElementById('ended').hidden`)); ended {
			status, _ := chromedp.Run(tab, chromedp.Evaluate[string](`document.getElementById('status').textContent`))
			shot(t, tab, b.artifacts, "clipboard-offer-ended")
			t.Fatalf("the session ended: the page says %q\n%s", status, lastLines(b.gwLog.Log.String(), 10))
		}
		got, err := browserClipboard(tab)
		return err == nil && got == fromSession, fmt.Sprintf("%q (%v)", got, err)
	})
	shot(t, tab, b.artifacts, "clipboard-offer-at-connect")
}
