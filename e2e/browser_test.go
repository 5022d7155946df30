package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/testkit"
)

// xrdpCertSHA256 is the fingerprint of the certificate xrdp presents
// (xrdp.ini's default, /etc/xrdp/cert.pem), which the test's resource
// policy pins for browser sessions.
func xrdpCertSHA256(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/etc/xrdp/cert.pem")
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("/etc/xrdp/cert.pem holds no PEM block")
	}
	if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(blk.Bytes)
	return hex.EncodeToString(sum[:])
}

// browserRig is the broker rig with the portal, browser sessions on, and
// the xrdp certificate pinned; the session's xterm writes what is typed
// into it to ~/typed.txt.
type browserRig struct {
	*brokerRig
	portal string
}

func newBrowserRig(t *testing.T, xs testkit.XRDPSetup) *browserRig {
	// The clipboard is withheld: the gateway renames the browser's
	// clipboard channel, and the session must work regardless.
	return newBrowserRigRedirecting(t, xs, "drives")
}

// newBrowserRigRedirecting is the browser rig whose connection policy
// allows the redirection classes in redirection (a YAML list's items).
func newBrowserRigRedirecting(t *testing.T, xs testkit.XRDPSetup, redirection string) *browserRig {
	return newBrowserRigWith(t, xs, redirection, nil)
}

// newBrowserRigWith is newBrowserRigRedirecting with edit applied to the
// configuration last.
func newBrowserRigWith(t *testing.T, xs testkit.XRDPSetup, redirection string, edit func(string) string) *browserRig {
	webPort := testkit.FreePort(t)
	portal := fmt.Sprintf("https://127.0.0.1:%d", webPort)
	pin := xrdpCertSHA256(t)
	b := newBrokerRigWith(t, xs, func(cfg string) string {
		cfg = strings.Replace(cfg, "broker:\n", "broker:\n  frontend_tokens: [e2e-portal-token]\n", 1)
		cfg = strings.Replace(cfg, "gateway:\n", "gateway:\n  browser_origins: [\""+portal+"\"]\n", 1)
		cfg = strings.Replace(cfg, "hosts: [127.0.0.1], ports:", "hosts: [127.0.0.1], host_certificate_sha256: ["+pin+"], ports:", 1)
		cfg = strings.Replace(cfg, "auth_methods: [paa]}", "auth_methods: [paa], redirection: ["+redirection+"]}", 1)
		cfg += fmt.Sprintf("web:\n  listen: \"127.0.0.1:%d\"\n  title: Deskway test portal\n", webPort)
		if edit != nil {
			cfg = edit(cfg)
		}
		return cfg
	})
	// A shell in the xterm would echo; cat writes each typed line to a
	// file, so the test reads what reached the session.
	wm := "#!/bin/sh\nexec xterm -geometry 80x24+10+10 -bg navy -fg white -e 'echo DESKWAY-E2E; cat > $HOME/typed.txt'\n"
	home := "/home/" + b.xrdp.User
	_ = os.Remove(home + "/typed.txt")
	if err := os.WriteFile(home+"/startwm.sh", []byte(wm), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := testkit.WaitPort(strings.TrimPrefix(portal, "https://"), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	return &browserRig{brokerRig: b, portal: portal}
}

// signIn signs the test user in to the portal and waits for the desktop.
func (b *browserRig) signIn(t *testing.T, ctx context.Context) {
	t.Helper()
	portalSignIn(t, ctx, b.portal, b.xrdp.User, b.xrdp.Password, "desk")
}

// portalSignIn signs user in at portal and waits for group's desktop.
func portalSignIn(t *testing.T, ctx context.Context, portal, user, password, group string) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(portal+"/"),
		chromedp.WaitVisible(chromedp.ID("user")),
		chromedp.SendKeys(chromedp.ID("user"), user),
		chromedp.SendKeys(chromedp.ID("password"), password),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")),
		chromedp.WaitVisible(chromedp.CSS("li.desktop[data-group='"+group+"']")),
	); err != nil {
		t.Fatal(err)
	}
}

// openInBrowser clicks "Open in browser" and returns the new tab.
func (b *browserRig) openInBrowser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	return openInBrowser(t, ctx, "desk")
}

// openInBrowser clicks group's "Open in browser" and returns the new tab,
// once its client has loaded.
func openInBrowser(t *testing.T, ctx context.Context, group string) context.Context {
	t.Helper()
	ch := chromedp.WaitNewTarget(ctx, func(i *target.Info) bool { return i.Type == "page" })
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("li.desktop[data-group='"+group+"'] button[formaction='/browser']"))); err != nil {
		t.Fatal(err)
	}
	var id target.ID
	select {
	case id = <-ch:
	case <-time.After(20 * time.Second):
		t.Fatal("Open in browser opened no tab")
	}
	tab, cancel := chromedp.NewContext(ctx, chromedp.WithTargetID(id))
	t.Cleanup(cancel)
	var console testkit.Buffer
	err := chromedp.Listen(tab, func(ev any) {
		switch e := ev.(type) {
		case *cdpruntime.EventExceptionThrown:
			fmt.Fprintf(&console, "exception: %s %v\n", e.ExceptionDetails.Text, e.ExceptionDetails.Exception)
		case *cdpruntime.EventConsoleAPICalled:
			for _, a := range e.Args {
				fmt.Fprintf(&console, "console.%s: %s\n", e.Type, a.Value)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the desktop page's console:\n%s", console.String())
		}
	})
	// A shape check, not a budget (docs/benchmarks/browser times the
	// page): on the loaded machine of a clean-clone run, the page at a
	// second origin, where the browser had cached none of the client and
	// its WebAssembly, did not show the client within 30 s.
	wait, cancel2 := context.WithTimeout(tab, 90*time.Second)
	defer cancel2()
	if err := chromedp.Do(wait, chromedp.WaitVisible(chromedp.CSS("#browser[data-ready='true'] #password"))); err != nil {
		t.Fatalf("the desktop page did not load its client: %v", err)
	}
	return tab
}

// connectInBrowser logs on in the desktop tab and waits for the desktop.
func connectInBrowser(t *testing.T, tab context.Context, user, password, artifacts string, log *testkit.Process) {
	t.Helper()
	if err := chromedp.Do(tab,
		chromedp.Clear(chromedp.ID("username")),
		chromedp.SendKeys(chromedp.ID("username"), user),
		chromedp.SendKeys(chromedp.ID("password"), password),
		chromedp.Click(chromedp.CSS("#credentials button")),
	); err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(tab, 40*time.Second)
	defer cancel()
	if err := chromedp.Do(wait, chromedp.WaitVisible(chromedp.CSS("#browser[data-connected='true'] #toolbar"))); err != nil {
		status, _ := chromedp.Run(tab, chromedp.Text(chromedp.ID("status")))
		shot(t, tab, artifacts, "browser-failed")
		t.Fatalf("the desktop did not connect: the page says %q\n%s", status, lastLines(log.Log.String(), 30))
	}
	// Connected is not yet drawn: wait for the session's navy xterm on
	// the canvas.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := chromedp.Run(tab, chromedp.Evaluate[int](navyPixels))
		if err == nil && n > 10000 {
			return
		}
		if time.Now().After(deadline) {
			shot(t, tab, artifacts, "browser-not-drawn")
			t.Fatalf("the canvas shows no xterm (%d navy pixels, %v)", n, err)
		}
	}
}

// navyPixels counts the canvas pixels in the xterm's navy.
const navyPixels = `(() => {
	const c = document.querySelector('iron-remote-desktop').shadowRoot.querySelector('canvas');
	const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
	let n = 0;
	for (let i = 0; i < d.length; i += 4) {
		if (d[i] < 16 && d[i+1] < 16 && d[i+2] > 112 && d[i+2] < 144) n++;
	}
	return n;
})()`

// canvasPNG is what the client's canvas shows.
func canvasPNG(t *testing.T, ctx context.Context) image.Image {
	t.Helper()
	url, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('iron-remote-desktop').shadowRoot.querySelector('canvas').toDataURL('image/png')`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(url, "data:image/png;base64,"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testBrowserDesktop is a person's path to a desktop in a browser tab:
// sign in to the portal, Open in browser, the password, the xrdp desktop
// drawn in the tab through the gateway's /rdp, typing that reaches the
// session's xterm, and the canvas compared pixel by pixel with the
// session's own screen.
func testBrowserDesktop(t *testing.T, xs testkit.XRDPSetup) {
	ctx := newBrowser(t)
	b := newBrowserRig(t, xs)
	b.signIn(t, ctx)
	shot(t, ctx, b.artifacts, "browser-1-desktops")
	mark := b.logMark()
	tab := b.openInBrowser(t, ctx)
	allowClipboard(t, tab, b.portal)
	shot(t, tab, b.artifacts, "browser-2-password")
	connectInBrowser(t, tab, b.xrdp.User, b.xrdp.Password, b.artifacts, b.gwLog)
	// Chromium offers permessage-deflate and the gateway compresses with
	// context takeover by default: the pixel checks below see it drawn.
	b.gatewayLogHas(t, mark, `"tunnel open"`, `"transport":"browser"`, `"target":"`+b.xrdp.Addr+`"`, `"permessage_deflate":"permessage-deflate;client_no_context_takeover"`)
	b.gatewayLogHas(t, mark, `"channels withheld by the connection policy"`, `"cliprdr"`)
	// The desktop: xrdp logged the user straight in (no login dialog), so
	// the session's xterm runs.
	for deadline := time.Now().Add(20 * time.Second); len(userProcs(t, b.xrdp.User, "xterm")) == 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			shot(t, tab, b.artifacts, "browser-no-session")
			t.Fatal("no xterm runs in the user's session: the browser did not log on")
		}
	}
	shot(t, tab, b.artifacts, "browser-3-desktop") // drawn: connectInBrowser waited for the xterm

	// Typing: click into the desktop, type a line.
	// Lines of text redraw rectangles of odd widths, which xrdp pads:
	// drawn wrong, they shear, and the pixel checks below see it.
	const line = "typed in chromium 42"
	more := strings.Repeat("the quick brown fox jumps over the lazy dog 0123456789\r", 4)
	if err := chromedp.Do(tab,
		chromedp.Click(chromedp.CSS("iron-remote-desktop")),
		chromedp.KeyEvent(line+"\r"+more),
	); err != nil {
		t.Fatal(err)
	}
	typed := "/home/" + b.xrdp.User + "/typed.txt"
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, _ := os.ReadFile(typed)
		if strings.Contains(string(got), line) {
			break
		}
		if time.Now().After(deadline) {
			shot(t, tab, b.artifacts, "browser-typing")
			t.Fatalf("the session's xterm got %q, want %q", got, line)
		}
	}

	// The clipboard, withheld by the policy, crosses in neither direction
	// although the page may use the browser's (with it allowed, it
	// crosses within a second: testBrowserDesktopClipboardResizeKeys).
	s := newSessionX(t, b.xrdp.User)
	s.copy(t, "secret copied in the session")
	if _, err := chromedp.Run(tab, chromedp.Evaluate[any](`navigator.clipboard.writeText("copied in the browser")`, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("writing the browser's clipboard: %v", err)
	}
	// A crossing is an event that should not come: both clipboards are
	// watched for five times the second it takes when allowed, and the
	// first crossing fails the test at once.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if got, err := browserClipboard(tab); err != nil || got != "copied in the browser" {
			t.Fatalf("the browser's clipboard holds %q (%v): the session's copy crossed a policy that withholds the clipboard", got, err)
		}
		if got, err := s.paste(); got != "secret copied in the session" {
			t.Fatalf("the session's clipboard holds %q (%v): the browser's copy crossed a policy that withholds the clipboard", got, err)
		}
	}

	// Pixels: the canvas against the session's own screen, once the
	// canvas has drawn what the session shows (the typed lines reach the
	// session before their pixels reach the tab).
	display := sessionDisplay(t, b.xrdp.User)
	xshot := filepath.Join(b.artifacts, "browser-session-screen.png")
	var canvas image.Image
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		canvas = canvasPNG(t, tab)
		imp := exec.Command("import", "-display", display, "-window", "root", xshot)
		imp.Env = append(os.Environ(), "XAUTHORITY=/home/"+b.xrdp.User+"/.Xauthority")
		if out, err := imp.CombinedOutput(); err != nil {
			t.Fatalf("import: %v %s", err, out)
		}
		f, err := os.Open(xshot)
		if err != nil {
			t.Fatal(err)
		}
		screen, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		d := comparePixels(canvas, screen)
		if d.sizeMismatch == "" && d.differentRows == 0 && d.share <= maxPixelShare {
			t.Logf("canvas against the session's screen: %+v", d)
			break
		}
		if time.Now().After(deadline) {
			savePNG(t, filepath.Join(b.artifacts, "browser-canvas.png"), canvas)
			t.Fatalf("the canvas differs from the session's screen: %+v", d)
		}
	}
	savePNG(t, filepath.Join(b.artifacts, "browser-canvas.png"), canvas)
	shot(t, tab, b.artifacts, "browser-4-typed")

	// And against xfreerdp: Disconnect in the tab (the page says so), then
	// the same session in xfreerdp through the same gateway, at the
	// canvas's size, and its screen against the canvas.
	if err := chromedp.Do(tab, chromedp.Click(chromedp.ID("disconnect")), chromedp.WaitVisible(chromedp.ID("ended"))); err != nil {
		t.Fatal(err)
	}
	if msg, _ := chromedp.Run(tab, chromedp.Text(chromedp.ID("status"))); !strings.Contains(msg, "You disconnected") {
		t.Fatalf("after Disconnect the page says %q", msg)
	}
	rdp := filepath.Join(b.dir, "desk.rdp")
	if err := os.WriteFile(rdp, []byte(b.launch().RDP), 0o600); err != nil {
		t.Fatal(err)
	}
	size := fmt.Sprintf("/size:%dx%d", canvas.Bounds().Dx(), canvas.Bounds().Dy())
	xctx, stop := context.WithCancel(context.Background())
	defer stop()
	xf := exec.CommandContext(xctx, "xfreerdp", rdp, "/u:"+b.xrdp.User, "/p:"+b.xrdp.Password, "/cert:ignore", "/gt:http", size)
	xf.Env = append(os.Environ(), "DISPLAY="+b.display)
	if err := xf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stop(); _ = xf.Wait() }()
	xpng := filepath.Join(b.artifacts, "browser-xfreerdp.png")
	crop := fmt.Sprintf("%dx%d+0+0", canvas.Bounds().Dx(), canvas.Bounds().Dy())
	var viaXfreerdp image.Image
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if out, err := exec.Command("import", "-display", b.display, "-window", "root", "-crop", crop, xpng).CombinedOutput(); err != nil {
			t.Fatalf("import: %v %s", err, out)
		}
		f, err := os.Open(xpng)
		if err != nil {
			t.Fatal(err)
		}
		viaXfreerdp, err = png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		// Drawn once the typed line is there too: compare then.
		if d := comparePixels(canvas, viaXfreerdp); d.sizeMismatch == "" && d.differentRows == 0 && d.share <= maxPixelShare {
			t.Logf("canvas against xfreerdp's screen: %+v", d)
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the canvas differs from xfreerdp's screen of the same session: %+v (see %s)", d, xpng)
		}
	}
}

func savePNG(t *testing.T, path string, img image.Image) {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// maxPixelShare is the share of pixels two pictures of one screen may
// differ in: drawn right, the canvas differs from the session's screen in
// 26 pixels of 780,800 (3.3e-5: the text cursor); with the typed lines
// drawn sheared it differs in 1,920 (2.5e-3).
const maxPixelShare = 5e-4

// pixelDiff is how two screenshots of one screen differ.
type pixelDiff struct {
	sizeMismatch string
	// share is the fraction of pixels whose colour differs by more than a
	// codec's rounding; differentRows counts rows where over a tenth of
	// the pixels differ, which is what a sheared or shifted row looks like.
	share         float64
	differentRows int
}

func comparePixels(a, b image.Image) pixelDiff {
	ab, bb := a.Bounds(), b.Bounds()
	if ab.Dx() != bb.Dx() || ab.Dy() != bb.Dy() {
		return pixelDiff{sizeMismatch: fmt.Sprintf("%dx%d against %dx%d", ab.Dx(), ab.Dy(), bb.Dx(), bb.Dy())}
	}
	var d pixelDiff
	total := 0
	for y := 0; y < ab.Dy(); y++ {
		row := 0
		for x := 0; x < ab.Dx(); x++ {
			r1, g1, b1, _ := a.At(ab.Min.X+x, ab.Min.Y+y).RGBA()
			r2, g2, b2, _ := b.At(bb.Min.X+x, bb.Min.Y+y).RGBA()
			if far(r1, r2) || far(g1, g2) || far(b1, b2) {
				row++
			}
		}
		total += row
		if row*10 > ab.Dx() {
			d.differentRows++
		}
	}
	d.share = float64(total) / float64(ab.Dx()*ab.Dy())
	return d
}

// far: more than 8 of 255 apart.
func far(a, b uint32) bool {
	if a > b {
		a, b = b, a
	}
	return b-a > 8*257
}

// testBrowserRefusalsShown: what a person sees when the gateway refuses a
// browser desktop. Each case opens the desktop from the portal, changes
// what the page connects with as an attacker or a stale page would, and
// reads the page's message: a pass that is not valid, a pass that has
// expired, a pass for another host, a host no resource policy allows,
// and the portal reached at an origin the gateway does not list.
func testBrowserRefusalsShown(t *testing.T, xs testkit.XRDPSetup) {
	ctx := newBrowser(t)
	b := newBrowserRig(t, xs)
	b.signIn(t, ctx)
	mint := func(host string, port int, ttl string) string {
		out, err := exec.Command(b.bin, "token", "-c", b.cfg, "--user", b.xrdp.User, "--host", host, "--port", fmt.Sprint(port), "--ttl", ttl).CombinedOutput()
		if err != nil {
			t.Fatalf("deskway token: %v %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	// Expired once its second and the gateway's 5 s of clock leeway pass.
	expired, expires := mint("127.0.0.1", b.rdpPort, "1s"), time.Now().Add(6500*time.Millisecond)
	elsewhere := mint("10.9.9.9", 3389, "5m")
	const (
		badPass   = "The pass for this desktop is not valid any more"
		forbidden = "A gateway policy does not let you reach this desktop from a browser."
	)
	try := func(name, js, want string) {
		t.Helper()
		tab := b.openInBrowser(t, ctx)
		if js != "" {
			if _, err := chromedp.Run(tab, chromedp.Evaluate[bool](js+"; true")); err != nil {
				t.Fatal(err)
			}
		}
		if err := chromedp.Do(tab,
			chromedp.SendKeys(chromedp.ID("password"), b.xrdp.Password),
			chromedp.Click(chromedp.CSS("#credentials button")),
		); err != nil {
			t.Fatal(err)
		}
		wait, cancel := context.WithTimeout(tab, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(wait, chromedp.WaitVisible(chromedp.ID("ended"))); err != nil {
			t.Fatalf("%s: the page shows no end: %v", name, err)
		}
		msg, err := chromedp.Run(tab, chromedp.Text(chromedp.ID("status")))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(msg, want) {
			t.Errorf("%s: the page says %q, want %q", name, msg, want)
		}
		shot(t, tab, b.artifacts, "refused-"+strings.ReplaceAll(name, " ", "-"))
	}
	try("invalid pass", "document.getElementById('browser').dataset.token = 'not-a-token'", badPass)
	try("pass for another host", "document.getElementById('browser').dataset.destination = '127.0.0.2:"+fmt.Sprint(b.rdpPort)+"'", forbidden)
	try("host outside the policies", "document.getElementById('browser').dataset.token = '"+elsewhere+"'; document.getElementById('browser').dataset.destination = '10.9.9.9:3389'", forbidden)
	time.Sleep(time.Until(expires))
	try("expired pass", "document.getElementById('browser').dataset.token = '"+expired+"'", badPass)
	// The same portal at another origin (localhost, not 127.0.0.1): the
	// gateway lists only the portal's, so a page elsewhere cannot use it.
	b.portal = strings.Replace(b.portal, "127.0.0.1", "localhost", 1)
	b.signIn(t, ctx)
	try("foreign origin", "", forbidden)
	if n := len(userProcs(t, b.xrdp.User, "xterm")); n != 0 {
		t.Fatalf("a refused browser reached the desktop: %d xterms run", n)
	}
}
