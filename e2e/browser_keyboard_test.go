package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/testkit"
)

// key is one key as a browser reports it: the physical key (code, ""
// for a character no key makes, as an input method or an on-screen
// keyboard delivers it), what it types (key), and whether AltGr is held.
type key struct {
	code, key string
	altGr     bool
}

// press sends the keys to the focused page as chromium's keyboard would.
func press(t *testing.T, tab context.Context, keys ...key) {
	t.Helper()
	var evs []input.DispatchKeyEventParams
	ev := func(typ input.DispatchKeyEventType, code, k, text string) input.DispatchKeyEventParams {
		return input.DispatchKeyEventParams{Type: typ, Code: code, Key: k, Text: text, UnmodifiedText: text}
	}
	for _, k := range keys {
		text := k.key
		switch k.key {
		case "Enter":
			text = "\r"
		case "Dead":
			text = ""
		}
		if k.altGr {
			evs = append(evs, ev(input.DispatchKeyEventTypeRawKeyDown, "AltRight", "AltGraph", ""))
		}
		typ := input.DispatchKeyEventTypeKeyDown
		if text == "" {
			typ = input.DispatchKeyEventTypeRawKeyDown
		}
		evs = append(evs, ev(typ, k.code, k.key, text), ev(input.DispatchKeyEventTypeKeyUp, k.code, k.key, ""))
		if k.altGr {
			evs = append(evs, ev(input.DispatchKeyEventTypeKeyUp, "AltRight", "AltGraph", ""))
		}
	}
	err := chromedp.Do(tab, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		for _, e := range evs {
			if _, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, e); err != nil {
				return err
			}
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
}

// waitTyped waits for the session's xterm to have written want.
func (b *browserRig) waitTyped(t *testing.T, tab context.Context, want, name string) {
	t.Helper()
	typed := "/home/" + b.xrdp.User + "/typed.txt"
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, _ := os.ReadFile(typed)
		if strings.Contains(string(got), want+"\n") {
			t.Logf("the session's xterm wrote %q", got)
			return
		}
		if time.Now().After(deadline) {
			shot(t, tab, b.artifacts, name)
			t.Fatalf("the session's xterm wrote %q, want the line %q", got, want)
		}
	}
}

// endSession ends the user's desktop session, so that the next logon
// starts one with the layout it names (a session keeps the layout it
// started with).
func (b *browserRig) endSession(t *testing.T) {
	t.Helper()
	_ = exec.Command("pkill", "-KILL", "-u", b.xrdp.User).Run()
	for deadline := time.Now().Add(15 * time.Second); len(userProcs(t, b.xrdp.User, "xterm")) > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the user's session did not end")
		}
	}
	_ = os.Remove("/home/" + b.xrdp.User + "/typed.txt")
}

// testBrowserKeyboardLayouts: a German and a French keyboard type their
// own characters into the session's xterm through the browser desktop.
// Chromium speaks German, and the page picks the German layout from its
// language; the person picks French in the form for the second session.
// Each key is sent as chromium reports a key of that keyboard (the
// physical key and the character), AltGr combinations included, and a
// character with no key (as an input method types it) goes as a Unicode
// keyboard event. Before, the client sent layout 0, xrdp mapped the keys
// as US English (ö came out as ;, z as y) and dropped characters with no
// key.
func testBrowserKeyboardLayouts(t *testing.T, xs testkit.XRDPSetup) {
	ctx := newBrowserWith(t, chromedp.Flag("lang", "de-DE"), chromedp.Flag("accept-lang", "de-DE,de"))
	b := newBrowserRig(t, xs)
	// A UTF-8 locale, so that the xterm writes what it gets as UTF-8.
	wm := "#!/bin/sh\nexport LANG=C.UTF-8 LC_ALL=C.UTF-8\nexec xterm -u8 -geometry 80x24+10+10 -bg navy -fg white -e 'echo DESKWAY-E2E; cat > $HOME/typed.txt'\n"
	if err := os.WriteFile("/home/"+b.xrdp.User+"/startwm.sh", []byte(wm), 0o755); err != nil {
		t.Fatal(err)
	}
	b.signIn(t, ctx)

	// German, as the browser's language suggests.
	tab := b.openInBrowser(t, ctx)
	chosen, err := chromedp.Run(tab, chromedp.Value(chromedp.ID("keyboard")))
	if err != nil {
		t.Fatal(err)
	}
	if chosen != "0407" {
		langs, _ := chromedp.Run(tab, chromedp.Evaluate[[]string]("navigator.languages"))
		t.Fatalf("a German browser's page (languages %q) chose keyboard layout %q, want 0407", langs, chosen)
	}
	shot(t, tab, b.artifacts, "keyboard-1-form")
	connectInBrowser(t, tab, b.xrdp.User, b.xrdp.Password, b.artifacts, b.gwLog)
	if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS("iron-remote-desktop"))); err != nil {
		t.Fatal(err)
	}
	press(t, tab,
		key{code: "KeyY", key: "z"},
		key{code: "Semicolon", key: "ö"},
		key{code: "Minus", key: "ß"},
		key{code: "KeyQ", key: "@", altGr: true},
		key{code: "KeyE", key: "€", altGr: true},
		key{code: "", key: "ä"}, // no key: a Unicode event
		key{code: "Enter", key: "Enter"},
	)
	b.waitTyped(t, tab, "zöß@€ä", "keyboard-german")
	shot(t, tab, b.artifacts, "keyboard-2-german")
	b.endSession(t)

	// French, chosen in the form.
	tab = b.openInBrowser(t, ctx)
	if err := chromedp.Do(tab, chromedp.SetValue(chromedp.ID("keyboard"), "040c")); err != nil {
		t.Fatal(err)
	}
	connectInBrowser(t, tab, b.xrdp.User, b.xrdp.Password, b.artifacts, b.gwLog)
	if err := chromedp.Do(tab, chromedp.Click(chromedp.CSS("iron-remote-desktop"))); err != nil {
		t.Fatal(err)
	}
	press(t, tab,
		key{code: "Digit2", key: "é"},
		key{code: "KeyQ", key: "a"},
		key{code: "Digit9", key: "ç"},
		key{code: "KeyE", key: "€", altGr: true},
		key{code: "", key: "ù"},               // no key: a Unicode event
		key{code: "BracketLeft", key: "Dead"}, // ^, composed in the session
		key{code: "KeyE", key: "ê"},
		key{code: "Enter", key: "Enter"},
	)
	b.waitTyped(t, tab, "éaç€ùê", "keyboard-french")
	shot(t, tab, b.artifacts, "keyboard-3-french")
}

// testBrowserLogonForm: the desktop's logon form names no user where
// the broker names none (a group whose host_username is none), rather
// than guess the portal's name, which xrdp refuses with its own login
// dialog inside the desktop once the one-time pass is spent; and it is
// laid out as a column, each label above its field.
func testBrowserLogonForm(t *testing.T, xs testkit.XRDPSetup) {
	ctx := newBrowser(t)
	b := newBrowserRigWith(t, xs, "drives", func(cfg string) string {
		return strings.Replace(cfg, "{name: desk, groups: [staff]}", "{name: desk, groups: [staff], host_username: none}", 1)
	})
	b.signIn(t, ctx)
	tab := b.openInBrowser(t, ctx)
	shot(t, tab, b.artifacts, "logon-form")
	if user, err := chromedp.Run(tab, chromedp.Value(chromedp.ID("username"))); err != nil || user != "" {
		t.Fatalf("the form names %q (%v) where the broker names no desktop user", user, err)
	}
	const below = `(() => {
		const r = (s) => document.querySelector(s).getBoundingClientRect();
		const order = ['label[for=username]', '#username', 'label[for=password]', '#password', 'label[for=keyboard]', '#keyboard', '#credentials button'];
		for (let i = 1; i < order.length; i++) {
			if (r(order[i]).top < r(order[i-1]).bottom) return order[i] + ' is beside ' + order[i-1];
		}
		return '';
	})()`
	if msg, err := chromedp.Run(tab, chromedp.Evaluate[string](below)); err != nil || msg != "" {
		t.Fatalf("the logon form is not a column: %s (%v)", msg, err)
	}
	connectInBrowser(t, tab, b.xrdp.User, b.xrdp.Password, b.artifacts, b.gwLog)
}

// testXfreerdpKeyboardLayout is testBrowserKeyboardLayouts's French line
// typed through xfreerdp with /kbd:0x040C, for comparison: the same
// physical keys (2, Q, 9, AltGr+E on the client's US keyboard) reach the
// session's xterm as the same characters. xfreerdp has no key without a
// physical key, so the Unicode character is left out.
func testXfreerdpKeyboardLayout(t *testing.T, xs testkit.XRDPSetup) {
	testkit.Require(t, "xfreerdp", "xdotool")
	b := newBrowserRig(t, xs)
	wm := "#!/bin/sh\nexport LANG=C.UTF-8 LC_ALL=C.UTF-8\nexec xterm -u8 -geometry 80x24+10+10 -bg navy -fg white -e 'echo DESKWAY-E2E; cat > $HOME/typed.txt'\n"
	if err := os.WriteFile("/home/"+b.xrdp.User+"/startwm.sh", []byte(wm), 0o755); err != nil {
		t.Fatal(err)
	}
	rdp := filepath.Join(b.dir, "desk.rdp")
	if err := os.WriteFile(rdp, []byte(b.launch().RDP), 0o600); err != nil {
		t.Fatal(err)
	}
	xctx, stop := context.WithCancel(context.Background())
	xf := exec.CommandContext(xctx, "xfreerdp", rdp, "/u:"+b.xrdp.User, "/p:"+b.xrdp.Password, "/cert:ignore", "/gt:http", "/kbd:0x0000040C", "/size:800x600")
	xf.Env = append(os.Environ(), "DISPLAY="+b.display)
	if err := xf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stop(); _ = xf.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); len(userProcs(t, b.xrdp.User, "xterm")) == 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("xfreerdp did not log on")
		}
	}
	xdo := func(args ...string) {
		t.Helper()
		cmd := exec.Command("xdotool", args...)
		cmd.Env = append(os.Environ(), "DISPLAY="+b.display)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("xdotool %v: %v %s", args, err, out)
		}
	}
	// No window manager: the pointer over the window and a click give it
	// the keyboard.
	xdo("search", "--sync", "--class", "xfreerdp", "mousemove", "--window", "%1", "300", "200", "click", "1", "windowfocus", "--sync", "%1")
	typed := "/home/" + b.xrdp.User + "/typed.txt"
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		xdo("key", "2", "q", "9", "Alt_R+e", "Return")
		got, _ := os.ReadFile(typed)
		if strings.Contains(string(got), "éaç€\n") {
			t.Logf("the session's xterm wrote %q", got)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("through xfreerdp /kbd:0x0000040C the session's xterm wrote %q, want the line %q", got, "éaç€")
		}
	}
}
