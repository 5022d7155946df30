package e2e

import (
	"context"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// typeInDemoXterm types, on a French keyboard, a shell command with é
// and € into the xterm of make run's desktop in a browser tab, and
// reads the file the command wrote back as the demo account's: the
// path a new user takes from make run to typing in the desktop.
func typeInDemoXterm(t *testing.T, tab context.Context, artifacts string) {
	t.Helper()
	if layout, err := chromedp.Run(tab, chromedp.Value(chromedp.ID("keyboard"))); err != nil || layout != "040c" {
		t.Fatalf("a French browser's page chose keyboard layout %q (%v), want 040c", layout, err)
	}
	u, err := user.Lookup(demoAccount)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(u.HomeDir, "été")
	_ = os.Remove(file)
	// twm gives the keyboard to the window under the pointer: the click
	// goes inside the xterm (at 40,40 on the session's screen), wherever
	// the page has placed and scaled the canvas.
	at, err := chromedp.Run(tab, chromedp.Evaluate[[]float64](`(() => {
		const c = document.querySelector('iron-remote-desktop').shadowRoot.querySelector('canvas');
		const r = c.getBoundingClientRect();
		return [r.left + 150 * r.width / c.width, r.top + 120 * r.height / c.height];
	})()`))
	if err != nil || len(at) != 2 {
		t.Fatalf("finding the desktop's canvas: %v", err)
	}
	if err := chromedp.Do(tab, chromedp.MouseClickXY(at[0], at[1])); err != nil {
		t.Fatal(err)
	}
	// echo é€ | tee été, as an AZERTY keyboard reports each key.
	sp := key{code: "Space", key: " "}
	e := key{code: "KeyE", key: "e"}
	eAcute := key{code: "Digit2", key: "é"}
	press(t, tab,
		e, key{code: "KeyC", key: "c"}, key{code: "KeyH", key: "h"}, key{code: "KeyO", key: "o"}, sp,
		eAcute, key{code: "KeyE", key: "€", altGr: true}, sp,
		key{code: "Digit6", key: "|", altGr: true}, sp,
		key{code: "KeyT", key: "t"}, e, e, sp,
		eAcute, key{code: "KeyT", key: "t"}, eAcute,
		key{code: "Enter", key: "Enter"},
	)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, err := os.ReadFile(file)
		if err == nil && string(got) == "é€\n" {
			st, err := os.Stat(file)
			if err != nil {
				t.Fatal(err)
			}
			if owner := strconv.Itoa(int(st.Sys().(*syscall.Stat_t).Uid)); owner != u.Uid {
				t.Fatalf("%s belongs to uid %s, not %s's %s", file, owner, demoAccount, u.Uid)
			}
			return
		}
		if time.Now().After(deadline) {
			shot(t, tab, artifacts, "typing-failed")
			entries, _ := os.ReadDir(u.HomeDir)
			var names []string
			for _, en := range entries {
				names = append(names, strconv.Quote(en.Name()))
			}
			t.Fatalf("the xterm's shell wrote %q to %s (%v); the home holds %v", got, file, err, names)
		}
	}
}
