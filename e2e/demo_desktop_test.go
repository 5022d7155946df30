package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"os/user"
	"strings"
	"testing"
	"time"

	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/testkit"
)

// demoAccount is the desktop account make run creates for the portal's
// demo user.
const demoAccount = "deskway-demo"

// withoutDemoAccount removes the demo desktop account, so make run
// starts from a machine without it, and again at the end of the test
// with whatever ran as it.
func withoutDemoAccount(t *testing.T) {
	t.Helper()
	remove := func() {
		if _, err := user.Lookup(demoAccount); err != nil {
			return
		}
		_ = exec.Command("pkill", "-KILL", "-u", demoAccount).Run()
		for deadline := time.Now().Add(10 * time.Second); exec.Command("pgrep", "-u", demoAccount).Run() == nil && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
		}
		if out, err := exec.Command("userdel", "-r", demoAccount).CombinedOutput(); err != nil && !strings.Contains(string(out), "mail spool") {
			t.Errorf("userdel %s: %v %s", demoAccount, err, out)
		}
		childproc.RemoveStaleX(10, 60)
	}
	remove()
	t.Cleanup(remove)
}

// browserDesktopDrawn waits for a browser tab's desktop to connect and
// draw the session's navy terminal, with no credentials typed.
func browserDesktopDrawn(t *testing.T, tab context.Context, artifacts string, log *testkit.Process) {
	t.Helper()
	wait, cancel := context.WithTimeout(tab, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(wait, chromedp.WaitVisible(chromedp.CSS("#browser[data-connected='true'] #toolbar"))); err != nil {
		// The status may be empty, which chromedp.Text would wait on.
		read, cancel := context.WithTimeout(tab, 5*time.Second)
		defer cancel()
		status, _ := chromedp.Run(read, chromedp.Evaluate[string](`document.getElementById('status').textContent`))
		shot(t, tab, artifacts, "browser-failed")
		t.Fatalf("the desktop did not connect: the page says %q\n%s", status, lastLines(log.Log.String(), 30))
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := chromedp.Run(tab, chromedp.Evaluate[int](navyPixels))
		if err == nil && n > 10000 {
			return
		}
		if time.Now().After(deadline) {
			shot(t, tab, artifacts, "browser-not-drawn")
			t.Fatalf("the canvas shows no terminal (%d navy pixels, %v)", n, err)
		}
	}
}

// portalShows reloads the portal's desktops page until group's card says
// want, and returns the card's button labels.
func portalShows(t *testing.T, ctx context.Context, portal, group, want, artifacts, name string) []string {
	t.Helper()
	card := "li.desktop[data-group='" + group + "']"
	var text string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		if err := chromedp.Do(ctx, chromedp.Navigate(portal+"/"), chromedp.WaitVisible(chromedp.CSS(card))); err != nil {
			t.Fatal(err)
		}
		text, _ = chromedp.Run(ctx, chromedp.Text(chromedp.CSS(card+" p.state")))
		if strings.Contains(text, want) {
			break
		}
		if time.Now().After(deadline) {
			shot(t, ctx, artifacts, name)
			t.Fatalf("the portal says %q, not %q", strings.TrimSpace(text), want)
		}
	}
	shot(t, ctx, artifacts, name)
	labels, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("`+card+` button")].map(b => b.firstChild.textContent.trim())`))
	if err != nil {
		t.Fatal(err)
	}
	return labels
}

// openSignedOn clicks group's "Open in browser" and returns the new tab,
// once its client has loaded: with single sign-on the page shows no
// logon form to wait for.
func openSignedOn(t *testing.T, ctx context.Context, group string) context.Context {
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
	if err := chromedp.Listen(tab, func(ev any) {
		switch e := ev.(type) {
		case *cdpruntime.EventExceptionThrown:
			fmt.Fprintf(&console, "exception: %s %v\n", e.ExceptionDetails.Text, e.ExceptionDetails.Exception)
		case *cdpruntime.EventConsoleAPICalled:
			for _, a := range e.Args {
				fmt.Fprintf(&console, "console.%s: %s\n", e.Type, a.Value)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the desktop page's console:\n%s", console.String())
		}
	})
	wait, cancel2 := context.WithTimeout(tab, 30*time.Second)
	defer cancel2()
	if err := chromedp.Do(wait, chromedp.WaitReady(chromedp.CSS("#browser[data-ready='true']"))); err != nil {
		t.Fatalf("the desktop page did not load its client: %v", err)
	}
	return tab
}
