package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/deskway/deskway/internal/testkit"
)

// phone makes the tab a phone's: 375 by 667 CSS pixels at twice the
// density, a mobile viewport and a touch screen.
func phone(t *testing.T, tab context.Context) {
	t.Helper()
	if err := chromedp.Do(tab, chromedp.EmulateViewport(phoneWidth, 667, chromedp.EmulateScale(2), chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulatePortrait)); err != nil {
		t.Fatal(err)
	}
}

// phoneWidth is the phone's screen width in CSS pixels.
const phoneWidth = 375

// noOverflow fails the test if the page is wider than the phone's
// screen, so that the person would scroll the whole page sideways. (Not
// window.innerWidth: a mobile browser zooms out to show a page wider
// than its screen, and innerWidth grows with it.)
func noOverflow(t *testing.T, tab context.Context, artifacts, name string) {
	t.Helper()
	w, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
	if err != nil {
		t.Fatal(err)
	}
	phoneShot(t, tab, artifacts, name)
	if w > phoneWidth {
		// What reaches past the screen: the outermost elements, and any
		// positioned out of their parent's flow (a scrolling box does
		// not clip those).
		wide, _ := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll('body *')].filter(e => {
			const w = document.documentElement.clientWidth;
			const r = e.getBoundingClientRect(), p = e.parentElement.getBoundingClientRect();
			return r.right > w && (p.right <= w || ['absolute', 'fixed'].includes(getComputedStyle(e).position));
		}).map(e => e.tagName.toLowerCase() + (e.className ? '.' + e.className : '') + ' ' + Math.round(e.getBoundingClientRect().right))`))
		t.Errorf("%s is %d CSS pixels wide on a screen of %d: %q", name, w, phoneWidth, wide)
	}
}

// phoneShot saves what the phone's screen shows. (A full-page shot
// lays the page out again at its full size, which a page sees as a
// resize.) The tab comes to the front first, as in shot: the console's
// pages are shot in the portal's tab, behind the desktop's, and a
// screenshot of it waited about three minutes for a frame beside other
// tests.
func phoneShot(t *testing.T, tab context.Context, dir, name string) {
	t.Helper()
	toFront(t, tab)
	png, err := chromedp.Run(tab, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	_ = os.MkdirAll(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// touch sends one touch event with the fingers at points (x, y pairs).
func touch(t *testing.T, tab context.Context, typ input.DispatchTouchEventType, points ...float64) {
	t.Helper()
	ps := []*input.TouchPoint{}
	for i := 0; i+1 < len(points); i += 2 {
		id := float64(i / 2)
		ps = append(ps, &input.TouchPoint{X: points[i], Y: points[i+1], ID: &id})
	}
	err := chromedp.Do(tab, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, input.DispatchTouchEvent, input.DispatchTouchEventParams{Type: typ, TouchPoints: ps})
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
}

// desktopGeometry is where the desktop's canvas is on the page and how
// many pixels the desktop has.
type desktopGeometry struct {
	Left, Top, Width, Height float64 // CSS pixels
	Pixels                   [2]int  // the desktop's width and height
}

// geometry is the desktop's geometry in the tab now.
func geometry(t *testing.T, tab context.Context) desktopGeometry {
	t.Helper()
	g, err := chromedp.Run(tab, chromedp.Evaluate[desktopGeometry](`(() => {
		const c = document.querySelector('iron-remote-desktop').shadowRoot.querySelector('canvas');
		const r = c.getBoundingClientRect();
		return {Left: r.left, Top: r.top, Width: r.width, Height: r.height, Pixels: [c.width, c.height]};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// onPage is where the desktop's pixel (x, y) is on the page.
func (g desktopGeometry) onPage(x, y int) (float64, float64) {
	return g.Left + (float64(x)+0.5)*g.Width/float64(g.Pixels[0]), g.Top + (float64(y)+0.5)*g.Height/float64(g.Pixels[1])
}

// xevButton is one button event xev printed.
var xevButton = regexp.MustCompile(`(ButtonPress|ButtonRelease) event[^\n]*\n[^\n]*root:\((\d+),(\d+)\)[^\n]*\n[^\n]*button (\d+)`)

// waitButton waits for xev in the session to report the nth button
// event (from 0) and checks it is kind, of button, near (x, y).
func (b *browserRig) waitButton(t *testing.T, tab context.Context, n int, kind string, button, x, y int) {
	t.Helper()
	log := "/home/" + b.xrdp.User + "/clicks.txt"
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, _ := os.ReadFile(log)
		evs := xevButton.FindAllStringSubmatch(string(got), -1)
		if len(evs) > n {
			e := evs[n]
			ex, _ := strconv.Atoi(e[2])
			ey, _ := strconv.Atoi(e[3])
			eb, _ := strconv.Atoi(e[4])
			if e[1] != kind || eb != button || abs(ex-x) > 2 || abs(ey-y) > 2 {
				t.Fatalf("the session's event %d is %s of button %d at (%d,%d), want %s of button %d at (%d,%d)", n, e[1], eb, ex, ey, kind, button, x, y)
			}
			return
		}
		if time.Now().After(deadline) {
			zoom, _ := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector('iron-remote-desktop').style.transform`))
			t.Logf("the desktop's transform: %q", zoom)
			phoneShot(t, tab, b.artifacts, "phone-no-click")
			t.Fatalf("the session saw %d button events, want a %s of button %d at (%d,%d):\n%s", len(evs), kind, button, x, y, got)
		}
	}
}

// abs is n's distance from 0.
func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// testBrowserDesktopOnPhone is a person with a phone (375 by 667, touch)
// at the portal, their desktop in a browser tab and the admin console:
// the desktop is a session of the phone's size drawn pixel for pixel; a
// tap is a left click, a long press and a two-finger tap right clicks,
// a drag moves with the button held, two fingers pinch to zoom and taps
// then land where the finger is (an xev window in the session reports
// each button where the X server got it); the Keyboard button opens the
// phone's keyboard, whose text (é and € among it) reaches the session's
// xterm; and no portal or console page is wider than the phone, the
// console's tables scrolling inside their own box. Before, the desktop
// was a 640-pixel session shrunk to 58 %, there was no keyboard button,
// a long press did nothing and the hosts page was 1,068 pixels wide.
func testBrowserDesktopOnPhone(t *testing.T, xs testkit.XRDPSetup) {
	// A French phone: the page picks the French layout from its language,
	// which the session needs for é (xrdp types a Unicode character by
	// the keys of the session's layout that make it).
	ctx := newBrowserWith(t, chromedp.Flag("lang", "fr-FR"), chromedp.Flag("accept-lang", "fr-FR,fr"))
	b := newBrowserRigWith(t, xs, "drives", func(cfg string) string {
		cfg = strings.Replace(cfg, "  users:\n", "  users:\n  - {name: ada, password: \"Ada-Admin-1\", groups: [admins]}\n", 1)
		return cfg + "  console: {admins: [admins]}\n"
	})
	// An xterm at the top, an xev window below it reporting every button.
	wm := "#!/bin/sh\nexport LANG=C.UTF-8 LC_ALL=C.UTF-8\n" +
		"stdbuf -oL xev -geometry 340x200+0+330 -event button > $HOME/clicks.txt &\n" +
		"exec xterm -u8 -geometry 40x20+10+10 -bg navy -fg white -e 'echo DESKWAY-E2E; cat > $HOME/typed.txt'\n"
	if err := os.WriteFile("/home/"+b.xrdp.User+"/startwm.sh", []byte(wm), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove("/home/" + b.xrdp.User + "/clicks.txt")
	phone(t, ctx)
	b.signIn(t, ctx)
	noOverflow(t, ctx, b.artifacts, "phone-1-desktops")

	tab := b.openInBrowser(t, ctx)
	phone(t, tab)
	noOverflow(t, tab, b.artifacts, "phone-2-logon")
	connectInBrowser(t, tab, b.xrdp.User, b.xrdp.Password, b.artifacts, b.gwLog)
	g := geometry(t, tab)
	t.Logf("the desktop: %dx%d pixels drawn at %.0fx%.0f from (%.0f,%.0f)", g.Pixels[0], g.Pixels[1], g.Width, g.Height, g.Left, g.Top)
	if g.Pixels[0] > phoneWidth || g.Width/float64(g.Pixels[0]) < 0.99 {
		shot(t, tab, b.artifacts, "phone-shrunk")
		t.Fatalf("on a 375-pixel screen the desktop is %d pixels wide drawn %.0f wide: shrunk", g.Pixels[0], g.Width)
	}
	noOverflow(t, tab, b.artifacts, "phone-3-desktop")

	// A tap on the xev window: a left click there.
	x, y := g.onPage(100, 400)
	touch(t, tab, input.DispatchTouchEventTypeTouchStart, x, y)
	touch(t, tab, input.DispatchTouchEventTypeTouchEnd)
	b.waitButton(t, tab, 0, "ButtonPress", 1, 100, 400)
	b.waitButton(t, tab, 1, "ButtonRelease", 1, 100, 400)
	// A long press: held until the session has the right button, a
	// right click.
	x, y = g.onPage(200, 450)
	touch(t, tab, input.DispatchTouchEventTypeTouchStart, x, y)
	b.waitButton(t, tab, 2, "ButtonPress", 3, 200, 450)
	touch(t, tab, input.DispatchTouchEventTypeTouchEnd)
	b.waitButton(t, tab, 3, "ButtonRelease", 3, 200, 450)
	// A drag, from one point to another with the left button held.
	x, y = g.onPage(50, 380)
	x2, y2 := g.onPage(250, 500)
	touch(t, tab, input.DispatchTouchEventTypeTouchStart, x, y)
	touch(t, tab, input.DispatchTouchEventTypeTouchMove, (x+x2)/2, (y+y2)/2)
	touch(t, tab, input.DispatchTouchEventTypeTouchMove, x2, y2)
	touch(t, tab, input.DispatchTouchEventTypeTouchEnd)
	b.waitButton(t, tab, 4, "ButtonPress", 1, 50, 380)
	b.waitButton(t, tab, 5, "ButtonRelease", 1, 250, 500)
	// Two fingers pinch out to twice the size, around the xev window's
	// middle; a tap then lands on the pixel under the finger.
	cx, cy := g.onPage(170, 430)
	touch(t, tab, input.DispatchTouchEventTypeTouchStart, cx-40, cy, cx+40, cy)
	touch(t, tab, input.DispatchTouchEventTypeTouchMove, cx-60, cy, cx+60, cy)
	touch(t, tab, input.DispatchTouchEventTypeTouchMove, cx-80, cy, cx+80, cy)
	touch(t, tab, input.DispatchTouchEventTypeTouchEnd)
	z := geometry(t, tab)
	if r := z.Width / g.Width; r < 1.9 || r > 2.1 {
		t.Fatalf("a pinch to twice the size drew the desktop %.2f times as wide", r)
	}
	phoneShot(t, tab, b.artifacts, "phone-4-zoomed")
	x, y = z.onPage(150, 420)
	touch(t, tab, input.DispatchTouchEventTypeTouchStart, x, y)
	touch(t, tab, input.DispatchTouchEventTypeTouchEnd)
	b.waitButton(t, tab, 6, "ButtonPress", 1, 150, 420)
	b.waitButton(t, tab, 7, "ButtonRelease", 1, 150, 420)
	// A two-finger tap: a right click between the fingers.
	x, y = z.onPage(160, 440)
	touch(t, tab, input.DispatchTouchEventTypeTouchStart, x-20, y, x+20, y)
	touch(t, tab, input.DispatchTouchEventTypeTouchEnd)
	b.waitButton(t, tab, 8, "ButtonPress", 3, 160, 440)
	// Pinch back to the whole desktop.
	touch(t, tab, input.DispatchTouchEventTypeTouchStart, cx-80, cy, cx+80, cy)
	touch(t, tab, input.DispatchTouchEventTypeTouchMove, cx-20, cy, cx+20, cy)
	touch(t, tab, input.DispatchTouchEventTypeTouchEnd)
	if back := geometry(t, tab); back.Width != g.Width || back.Left != g.Left || back.Top != g.Top {
		t.Fatalf("pinched back in, the desktop is drawn at %+v, want %+v", back, g)
	}

	// The pointer on the xterm gives it the keyboard (there is no window
	// manager); the Keyboard button opens the phone's keyboard.
	x, y = g.onPage(100, 100)
	touch(t, tab, input.DispatchTouchEventTypeTouchStart, x, y)
	touch(t, tab, input.DispatchTouchEventTypeTouchEnd)
	// The toolbar is up since the desktop connected: the button is
	// there now or not at all.
	box, err := chromedp.Run(tab, chromedp.Evaluate[[]float64](`(() => {
		const b = document.getElementById('keys');
		if (!b || !b.checkVisibility()) return [];
		const r = b.getBoundingClientRect();
		return [r.left + r.width/2, r.top + r.height/2];
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if len(box) != 2 {
		t.Fatal("the desktop's toolbar shows no Keyboard button on a phone")
	}
	touch(t, tab, input.DispatchTouchEventTypeTouchStart, box[0], box[1])
	touch(t, tab, input.DispatchTouchEventTypeTouchEnd)
	if err := chromedp.Do(tab, chromedp.WaitReady(chromedp.CSS("#keys[aria-pressed='true']"))); err != nil {
		t.Fatal(err)
	}
	if f, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.activeElement.id`)); err != nil || f != "typing" {
		t.Fatalf("after a tap on Keyboard the page's focus is on %q (%v), not the typing field", f, err)
	}
	// The phone's keyboard inserts text, as its input method does, and
	// sends Enter as a key.
	for _, text := range []string{"téléphone", " 5 €"} {
		err := chromedp.Do(tab, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, input.InsertText, input.InsertTextParams{Text: text})
			return err
		}))
		if err != nil {
			t.Fatal(err)
		}
	}
	press(t, tab, key{code: "Enter", key: "Enter"})
	b.waitTyped(t, tab, "téléphone 5 €", "phone-typed")
	phoneShot(t, tab, b.artifacts, "phone-5-typed")

	// The console, on the same phone.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("form[action='/signout'] button")), chromedp.WaitVisible(chromedp.ID("user")),
		chromedp.SendKeys(chromedp.ID("user"), "ada"), chromedp.SendKeys(chromedp.ID("password"), "Ada-Admin-1"),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")), chromedp.WaitVisible(chromedp.CSS("header nav"))); err != nil {
		t.Fatal(err)
	}
	pages, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('header nav a')].map(a => a.pathname)`))
	if err != nil || len(pages) < 3 {
		t.Fatalf("the console's menu links %q (%v)", pages, err)
	}
	for _, p := range pages {
		if err := chromedp.Do(ctx, chromedp.Navigate(b.portal+p), chromedp.WaitVisible(chromedp.CSS("main"))); err != nil {
			t.Fatal(err)
		}
		noOverflow(t, ctx, b.artifacts, "phone-console"+strings.ReplaceAll(p, "/", "-"))
	}
	// The hosts table is wider than the phone: it scrolls in its box.
	if err := chromedp.Do(ctx, chromedp.Navigate(b.portal+"/admin/hosts"), chromedp.WaitVisible(chromedp.CSS("tr[data-host]"))); err != nil {
		t.Fatal(err)
	}
	w, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`(() => { const t = document.querySelector('table'); return [t.scrollWidth, t.clientWidth, t.getBoundingClientRect().right]; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if w[0] <= w[1] || w[2] > phoneWidth {
		t.Errorf("the hosts table is %.0f wide in a box %.0f wide ending at %.0f: it does not scroll in its box", w[0], w[1], w[2])
	}
}
