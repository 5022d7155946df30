package e2e

import (
	"bufio"
	"context"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/testkit"
)

// testBrowserDesktopClipboardResizeKeys is what a person does in a
// browser desktop besides typing, where the connection policy allows the
// clipboard: text copied in the session is on the browser's clipboard,
// text copied in the browser is on the session's; the on-screen
// Ctrl+Alt+Del and Windows-key buttons press those keys in the session;
// and a smaller window resizes the session's screen to it.
func testBrowserDesktopClipboardResizeKeys(t *testing.T, xs testkit.XRDPSetup) {
	testkit.Require(t, "xclip", "xinput", "xdpyinfo")
	ctx := newBrowser(t)
	b := newBrowserRigRedirecting(t, xs, "clipboard")
	b.signIn(t, ctx)
	tab := b.openInBrowser(t, ctx)
	allowClipboard(t, tab, b.portal)
	mark := b.logMark()
	connectInBrowser(t, tab, b.xrdp.User, b.xrdp.Password, b.artifacts, b.gwLog)
	b.gatewayLogHas(t, mark, `"tunnel open"`, `"transport":"browser"`)
	if log := b.gwLog.Log.String()[mark:]; strings.Contains(log, "channels withheld") {
		t.Fatalf("the policy allows the clipboard, yet the gateway withheld a channel:\n%s", lastLines(log, 10))
	}
	s := newSessionX(t, b.xrdp.User)
	s.waitClipboardChannel(t)

	// Copied in the session (an X client owning the CLIPBOARD selection,
	// as a text editor's Copy does): the page's client is told, fetches
	// the text and puts it on the browser's clipboard.
	fromSession := "copied in the session " + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	s.copy(t, fromSession)
	eventually(t, 20*time.Second, "the browser's clipboard to hold the session's copy", func() (bool, string) {
		got, err := browserClipboard(tab)
		return err == nil && got == fromSession, fmt.Sprintf("%q (%v)", got, err)
	})

	// Copied in the browser: the page sees the clipboard change and offers
	// it to the session, where pasting fetches it.
	fromBrowser := "copied in the browser " + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	if _, err := chromedp.Run(tab, chromedp.Evaluate[any](fmt.Sprintf("navigator.clipboard.writeText(%q)", fromBrowser), chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("writing the browser's clipboard: %v", err)
	}
	eventually(t, 20*time.Second, "the session's clipboard to hold the browser's copy", func() (bool, string) {
		got, err := s.paste()
		return err == nil && got == fromBrowser, fmt.Sprintf("%q (%v)", got, err)
	})
	shot(t, tab, b.artifacts, "browser-5-clipboard")

	// Keys a browser would keep for itself, from the toolbar's buttons:
	// the session's X server sees each pressed.
	keys := s.watchKeys(t)
	if err := chromedp.Do(tab, chromedp.Click(chromedp.ID("cad")), chromedp.Click(chromedp.ID("meta"))); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for _, name := range []string{"Control_L", "Alt_L", "Delete", "Super_L"} {
		want[name] = s.keycode(t, name)
	}
	eventually(t, 10*time.Second, "Ctrl+Alt+Del and the Windows key pressed in the session", func() (bool, string) {
		pressed := keys.pressed()
		var missing []string
		for name, code := range want {
			if !pressed[code] {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0, fmt.Sprintf("not pressed: %v; pressed keycodes %v", missing, pressed)
	})

	// A smaller window: the page asks the host (display control) for a
	// screen the size of the space below the toolbar, and draws it 1:1.
	// The window's 1010 pixels are no multiple of 4: the page asks for
	// 1008, so that xrdp's bitmaps, padded to a multiple of 4, stay on the
	// screen.
	before := s.screenSize(t)
	resizeWindow(t, tab, 1010, 700)
	var wantW, wantH int
	eventually(t, 30*time.Second, "the session's screen to take the window's new size", func() (bool, string) {
		sz, err := chromedp.Run(tab, chromedp.Evaluate[[]int](`(() => {
			const s = document.getElementById('screen'), bar = document.getElementById('toolbar');
			return [Math.max(640, s.clientWidth) & ~3, Math.max(480, window.innerHeight - bar.offsetHeight) & ~1];
		})()`))
		if err != nil || len(sz) != 2 {
			return false, fmt.Sprint(err)
		}
		wantW, wantH = sz[0], sz[1]
		got := s.screenSize(t)
		status, _ := chromedp.Run(tab, chromedp.Text(chromedp.ID("status")))
		return got == [2]int{wantW, wantH}, fmt.Sprintf("session %dx%d, the page's space %dx%d (before %dx%d); the page says %q", got[0], got[1], wantW, wantH, before[0], before[1], status)
	})
	eventually(t, 20*time.Second, "the canvas to be the session's new size, with the xterm drawn", func() (bool, string) {
		c := canvasPNG(t, tab)
		n, _ := chromedp.Run(tab, chromedp.Evaluate[int](navyPixels))
		return c.Bounds().Dx() == wantW && c.Bounds().Dy() == wantH && n > 10000, fmt.Sprintf("canvas %dx%d, %d navy pixels", c.Bounds().Dx(), c.Bounds().Dy(), n)
	})
	shot(t, tab, b.artifacts, "browser-6-resized")
	// And drawn right: the canvas against the session's own screen.
	eventually(t, 10*time.Second, "the resized canvas to show the session's screen", func() (bool, string) {
		d := comparePixels(canvasPNG(t, tab), s.screenshot(t, filepath.Join(b.artifacts, "browser-resized-session-screen.png")))
		return d.sizeMismatch == "" && d.differentRows == 0 && d.share <= maxPixelShare, fmt.Sprintf("%+v", d)
	})
}

// screenshot is the session's screen, saved at path.
func (s *sessionX) screenshot(t *testing.T, path string) image.Image {
	t.Helper()
	if out, err := s.command("import", "-window", "root", path).CombinedOutput(); err != nil {
		t.Fatalf("import: %v %s", err, out)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// allowClipboard gives the page what a person gives it by answering the
// browser's prompt (clipboard read and write), and keeps it focused as
// the window in front would be: the client reads the clipboard only while
// its page has the focus.
func allowClipboard(t *testing.T, tab context.Context, origin string) {
	t.Helper()
	for _, name := range []string{"clipboard-read", "clipboard-write"} {
		if _, err := chromedp.Call(tab, browser.SetPermission, browser.SetPermissionParams{
			Permission: &browser.PermissionDescriptor{Name: name}, Setting: "granted", Origin: origin,
		}); err != nil {
			t.Fatalf("granting %s: %v", name, err)
		}
	}
	if _, err := chromedp.Call(tab, emulation.SetFocusEmulationEnabled, emulation.SetFocusEmulationEnabledParams{Enabled: true}); err != nil {
		t.Fatal(err)
	}
}

func browserClipboard(tab context.Context) (string, error) {
	return chromedp.Run(tab, chromedp.Evaluate[string]("navigator.clipboard.readText()", chromedp.EvalAwaitPromise))
}

// resizeWindow gives the tab's browser window a new size, as a person
// dragging its corner does.
func resizeWindow(t *testing.T, tab context.Context, w, h int64) {
	t.Helper()
	win, err := chromedp.Call(tab, browser.GetWindowForTarget, browser.GetWindowForTargetParams{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(tab, browser.SetWindowBounds, browser.SetWindowBoundsParams{
		WindowID: win.WindowID, Bounds: &browser.Bounds{Width: w, Height: h},
	}); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds, failing with what cond last said.
func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
	}
	t.Fatalf("waited %v for %s: %s", within, what, last)
}

// sessionX runs X clients in a user's xrdp session, as programs the user
// started in it would.
type sessionX struct {
	env []string
}

func newSessionX(t *testing.T, user string) *sessionX {
	return &sessionX{env: append(os.Environ(), "DISPLAY="+sessionDisplay(t, user), "XAUTHORITY=/home/"+user+"/.Xauthority")}
}

func (s *sessionX) command(name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Env = s.env
	return c
}

// waitClipboardChannel waits until the session's channel server has
// joined the clipboard channel. xrdp-chansrv starts watching who owns the
// X clipboard only then, and does not look at the owner it finds: a copy
// made earlier never reaches the client (a person copies after the
// desktop has been shown a while, a test right after it appears). The
// atoms it interns just before it starts watching mark the moment.
func (s *sessionX) waitClipboardChannel(t *testing.T) {
	t.Helper()
	eventually(t, 20*time.Second, "xrdp-chansrv to join the clipboard channel", func() (bool, string) {
		out, err := s.command("xlsatoms", "-name", "XRDP_CLIP_PROPERTY_ATOM").Output()
		return err == nil && strings.Contains(string(out), "XRDP_CLIP_PROPERTY_ATOM"), fmt.Sprintf("xlsatoms: %q %v", out, err)
	})
}

// copy makes text the session's clipboard: xclip owns the selection
// until the test ends or another program copies. It returns once a paste
// in the session gets text: xclip takes the selection a moment after it
// starts (longer on a loaded machine), and a paste before that finds the
// clipboard empty, which a caller would take for a copy lost.
func (s *sessionX) copy(t *testing.T, text string) {
	t.Helper()
	c := s.command("xclip", "-quiet", "-selection", "clipboard", "-in")
	c.Stdin = strings.NewReader(text)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	eventually(t, 20*time.Second, "xclip to own the session's clipboard", func() (bool, string) {
		got, err := s.paste()
		return err == nil && got == text, fmt.Sprintf("pasted %q (%v)", got, err)
	})
}

// paste is the session's clipboard, as a program pasting gets it.
func (s *sessionX) paste() (string, error) {
	c := s.command("xclip", "-selection", "clipboard", "-out")
	out, err := c.Output()
	if err != nil {
		return "", fmt.Errorf("xclip -out: %w", err)
	}
	return string(out), nil
}

// screenSize is the width and height of the session's X screen.
func (s *sessionX) screenSize(t *testing.T) [2]int {
	t.Helper()
	out, err := s.command("xdpyinfo").Output()
	if err != nil {
		t.Fatalf("xdpyinfo: %v", err)
	}
	m := regexp.MustCompile(`dimensions:\s+(\d+)x(\d+) pixels`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("xdpyinfo shows no dimensions:\n%s", out)
	}
	w, _ := strconv.Atoi(m[1])
	h, _ := strconv.Atoi(m[2])
	return [2]int{w, h}
}

// keycode is the session keyboard's key for the keysym name.
func (s *sessionX) keycode(t *testing.T, name string) int {
	t.Helper()
	out, err := s.command("xmodmap", "-pke").Output()
	if err != nil {
		t.Fatalf("xmodmap: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		// keycode  37 = Control_L NoSymbol Control_L
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "keycode" && f[2] == "=" && f[3] == name {
			n, err := strconv.Atoi(f[1])
			if err == nil {
				return n
			}
		}
	}
	t.Fatalf("the session's keyboard map has no key for %s", name)
	return 0
}

// keyWatch records the keys pressed in a session, whichever window has
// the focus (XInput 2 raw events on the root window).
type keyWatch struct {
	mu   sync.Mutex
	seen map[int]bool
}

func (s *sessionX) watchKeys(t *testing.T) *keyWatch {
	t.Helper()
	c := s.command("xinput", "test-xi2", "--root")
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	w := &keyWatch{seen: map[int]bool{}}
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		press, first := false, true
		for sc.Scan() {
			if first {
				close(ready)
				first = false
			}
			line := strings.TrimSpace(sc.Text())
			switch {
			case strings.HasPrefix(line, "EVENT type"):
				press = strings.Contains(line, "(RawKeyPress)")
			case press && strings.HasPrefix(line, "detail:"):
				if n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "detail:"))); err == nil {
					w.mu.Lock()
					w.seen[n] = true
					w.mu.Unlock()
				}
			}
		}
		if first {
			close(ready)
		}
	}()
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait(); <-done })
	// xinput lists the devices first; once it prints, it is listening.
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("xinput test-xi2 printed nothing")
	}
	return w
}

func (w *keyWatch) pressed() map[int]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := make(map[int]bool, len(w.seen))
	for k := range w.seen {
		p[k] = true
	}
	return p
}
