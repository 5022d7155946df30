package e2e

import (
	"context"
	"os/exec"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/bench/childproc"
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
		status, _ := chromedp.Run(tab, chromedp.Text(chromedp.ID("status")))
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
