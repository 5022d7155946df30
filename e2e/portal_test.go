package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/testkit"
)

// newBrowser starts Debian's chromium, headless, for one test.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	return newBrowserWith(t)
}

// newBrowserWith is newBrowser with more of chromium's options.
func newBrowserWith(t *testing.T, more ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	testkit.Require(t, "chromium")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath("/usr/bin/chromium"),
		chromedp.NoSandbox, // the tests run as root
		chromedp.Flag("ignore-certificate-errors", true),
		chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(t.TempDir()),
	)
	opts = append(opts, more...)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	// The first call starts the browser, for as long as ctx lives; the
	// test's deadline goes on a context derived after it.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	tctx, cancel3 := context.WithTimeout(ctx, 5*time.Minute)
	t.Cleanup(cancel3)
	return tctx
}

// toFront makes ctx's tab the one shown, as a person clicking on it
// would: headless Chromium may draw no frames for a tab behind another,
// and a screenshot waits for a frame (one of the portal, behind the
// desktop's tab, once waited out the browser's five minutes).
func toFront(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := chromedp.Call(ctx, page.BringToFront, cdp.Empty{}); err != nil {
		t.Fatalf("bring the tab to the front: %v", err)
	}
}

// shot saves what the browser shows, for a person to look at.
func shot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	toFront(t, ctx)
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	_ = os.MkdirAll(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// testPortalSignInLaunchAndConnect is a person's path through the portal
// in a real browser: the sign-in page, a wrong password, the right one,
// their desktop, Launch, the downloaded .rdp file opened in xfreerdp
// through the gateway to the xrdp desktop, the desktop shown as
// disconnected afterwards, and sign-out. A cross-site form post to the
// portal is refused.
func testPortalSignInLaunchAndConnect(t *testing.T, xs testkit.XRDPSetup) {
	ctx := newBrowser(t)
	webPort := testkit.FreePort(t)
	b := newBrokerRigWith(t, xs, func(cfg string) string {
		cfg = strings.Replace(cfg, "broker:\n", "broker:\n  frontend_tokens: [e2e-portal-token]\n", 1)
		return cfg + fmt.Sprintf("web:\n  listen: \"127.0.0.1:%d\"\n  title: Deskway test portal\n", webPort)
	})
	portal := fmt.Sprintf("https://127.0.0.1:%d", webPort)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", webPort), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	downloads := t.TempDir()
	var text, url string
	must := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatal(err)
		}
	}
	read := func(a chromedp.Action[string]) string {
		t.Helper()
		v, err := chromedp.Run(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	events := true
	if _, err := chromedp.Call(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads, EventsEnabled: &events}); err != nil {
		t.Fatal(err)
	}
	must(chromedp.Navigate(portal+"/"), chromedp.WaitVisible(chromedp.ID("user")))
	url = read(chromedp.Location())
	if url != portal+"/signin" {
		t.Fatalf("the portal opened on %s, want the sign-in page", url)
	}
	shot(t, ctx, b.artifacts, "portal-1-signin")
	// A wrong password: told so, and still on the sign-in page.
	must(chromedp.SendKeys(chromedp.ID("user"), b.xrdp.User),
		chromedp.SendKeys(chromedp.ID("password"), "not-the-password"),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")),
		chromedp.WaitVisible(chromedp.CSS(".error")))
	text = read(chromedp.Text(chromedp.CSS(".error")))
	if !strings.Contains(text, "Wrong user name or password") {
		t.Fatalf("after a wrong password the page says %q", text)
	}
	shot(t, ctx, b.artifacts, "portal-2-wrong-password")
	// The right one: the user's desktop, not running.
	desk := chromedp.CSS("li.desktop[data-group='desk']")
	// The page kept the user name and emptied the password.
	if v := read(chromedp.Value(chromedp.ID("user"))); v != b.xrdp.User {
		t.Fatalf("after a wrong password the user name field holds %q", v)
	}
	must(chromedp.SendKeys(chromedp.ID("password"), b.xrdp.Password),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")),
		chromedp.WaitVisible(desk))
	text = read(chromedp.Text(desk))
	if !strings.Contains(text, "Not running.") || !strings.Contains(text, "Launch") {
		t.Fatalf("the desktop reads %q", text)
	}
	shot(t, ctx, b.artifacts, "portal-3-desktops")
	// Launch downloads desk.rdp.
	must(chromedp.Click(chromedp.CSS("li.desktop[data-group='desk'] button")))
	rdp := filepath.Join(downloads, "desk.rdp")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st, err := os.Stat(rdp); err == nil && st.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			ents, _ := os.ReadDir(downloads)
			t.Fatalf("no desk.rdp downloaded; the folder holds %v", ents)
		}
	}
	body, _ := os.ReadFile(rdp)
	if !strings.Contains(string(body), "gatewayaccesstoken:s:") {
		t.Fatalf("the downloaded file is not an .rdp file with a gateway token:\n%s", body)
	}
	// The file, opened as the portal page says: xfreerdp FILE.rdp.
	mark := b.logMark()
	b.desktop(t, "portal-4-xfreerdp-desktop", rdp, "/gt:http")
	b.gatewayLogHas(t, mark, `"tunnel open"`, `"method":"paa"`, `"target":"`+b.xrdp.Addr+`"`)
	b.waitState("disconnected")
	must(chromedp.Navigate(portal+"/"), chromedp.WaitVisible(desk))
	text = read(chromedp.Text(desk))
	if !strings.Contains(text, "Disconnected on xrdp-host") || !strings.Contains(text, "Reconnect") {
		t.Fatalf("after the session the desktop reads %q", text)
	}
	shot(t, ctx, b.artifacts, "portal-5-disconnected")
	// Log off from the page: the agent ends the session on the host.
	must(chromedp.Click(chromedp.CSS("li.desktop[data-group='desk'] form.logoff button")),
		chromedp.WaitVisible(chromedp.CSS(".notice")))
	text = read(chromedp.Text(chromedp.CSS(".notice")))
	if !strings.Contains(text, "Logging off: the session") {
		t.Fatalf("after Log off the page says %q", text)
	}
	shot(t, ctx, b.artifacts, "portal-5b-logging-off")
	b.waitState("none (<nil>)")
	if left := running(t, b.xrdp.User); len(left) > 0 {
		t.Fatalf("after the portal's Log off %s still runs:\n%s", b.xrdp.User, strings.Join(left, "\n"))
	}
	must(chromedp.Navigate(portal+"/"), chromedp.WaitVisible(desk))
	if text = read(chromedp.Text(desk)); !strings.Contains(text, "Not running.") {
		t.Fatalf("after the logoff the desktop reads %q", text)
	}
	// A page elsewhere that posts to the portal is refused, signed in or not.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<form id="f" method="post" action="%s/launch"><input name="delivery_group" value="desk"></form><script>document.getElementById("f").submit()</script>`, portal)
	}))
	defer evil.Close()
	must(chromedp.Navigate(evil.URL))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		url = read(chromedp.Location())
		if strings.HasPrefix(url, portal) || time.Now().After(deadline) {
			break
		}
	}
	must(chromedp.WaitReady(chromedp.CSS("body")))
	text = read(chromedp.Text(chromedp.CSS("body")))
	if !strings.Contains(text, "cross-site request refused") {
		t.Fatalf("a cross-site post to %s showed %q", url, text)
	}
	shot(t, ctx, b.artifacts, "portal-6-cross-site-refused")
	if ents, _ := os.ReadDir(downloads); len(ents) != 1 {
		t.Fatalf("the cross-site post downloaded a file: %v", ents)
	}
	// Sign out: back to the sign-in page, and the desktops are gone.
	must(chromedp.Navigate(portal+"/"),
		chromedp.WaitVisible(chromedp.CSS("form.signout button")),
		chromedp.Click(chromedp.CSS("form.signout button")),
		chromedp.WaitVisible(chromedp.ID("user")),
		chromedp.Navigate(portal+"/"),
		chromedp.WaitVisible(chromedp.ID("user")))
	url = read(chromedp.Location())
	if url != portal+"/signin" {
		t.Fatalf("after sign-out / went to %s", url)
	}
}

// portalLaunch signs in to the portal at base in a browser as user and
// presses Launch on group, leaving the downloaded GROUP.rdp in dir.
func portalLaunch(t *testing.T, base, user, password, group, dir string) {
	t.Helper()
	ctx := newBrowser(t)
	events := true
	if _, err := chromedp.Call(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dir, EventsEnabled: &events}); err != nil {
		t.Fatal(err)
	}
	card := chromedp.CSS("li.desktop[data-group='" + group + "']")
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.ID("user")),
		chromedp.SendKeys(chromedp.ID("user"), user),
		chromedp.SendKeys(chromedp.ID("password"), password),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")),
		chromedp.WaitVisible(card),
	); err != nil {
		t.Fatalf("signing in to %s as %s: %v", base, user, err)
	}
	shot(t, ctx, filepath.Join("artifacts", t.Name()), "desktops")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("li.desktop[data-group='"+group+"'] button"))); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, group+".rdp")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st, err := os.Stat(file); err == nil && st.Size() > 0 {
			return
		}
		if time.Now().After(deadline) {
			ents, _ := os.ReadDir(dir)
			t.Fatalf("no %s.rdp downloaded; the folder holds %v", group, ents)
		}
	}
}
