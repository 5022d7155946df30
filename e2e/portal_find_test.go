package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/deskway/deskway/internal/testkit"
)

// findGroups are six delivery groups beside the rig's desk, named so
// that desk sorts last by name.
const findGroups = `  - {name: desk, description: "Office desktop", groups: [staff]}
  - {name: accounts, description: "Ledger and invoicing", groups: [staff]}
  - {name: analytics, description: "Reports and dashboards", groups: [staff]}
  - {name: billing, description: "Customer billing", groups: [staff]}
  - {name: build-farm, description: "Compilers for the release builds", groups: [staff]}
  - {name: cad, description: "Drawing office, 3D CAD", groups: [staff]}
`

// shownDesktops is the delivery groups the page shows, in its order.
func shownDesktops(t *testing.T, ctx context.Context) []string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("li.desktop"))
		.filter((li) => li.getClientRects().length > 0).map((li) => li.dataset.group)`))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitShown waits until the page shows the desktops want, in that order.
func waitShown(t *testing.T, ctx context.Context, what string, want ...string) {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if got = shownDesktops(t, ctx); slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s the page shows %v, want %v", what, got, want)
		}
	}
}

// testPortalFindAndRecentFirst is a person with six desktops: the page
// lists them by name, offers a search box that narrows the list as they
// type, and after they launch one, lists it first with when it was used;
// with script off, the same search goes to the portal as ?q= and the page
// comes back narrowed.
func testPortalFindAndRecentFirst(t *testing.T, xs testkit.XRDPSetup) {
	ctx := newBrowser(t)
	webPort := testkit.FreePort(t)
	b := newBrokerRigWith(t, xs, func(cfg string) string {
		cfg = strings.Replace(cfg, "broker:\n", "broker:\n  frontend_tokens: [e2e-portal-token]\n", 1)
		cfg = strings.Replace(cfg, "  - {name: desk, groups: [staff]}\n", findGroups, 1)
		return cfg + fmt.Sprintf("web:\n  listen: \"127.0.0.1:%d\"\n  title: Deskway test portal\n", webPort)
	})
	portal := fmt.Sprintf("https://127.0.0.1:%d", webPort)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", webPort), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	downloads := t.TempDir()
	events := true
	if _, err := chromedp.Call(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads, EventsEnabled: &events}); err != nil {
		t.Fatal(err)
	}
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
	portalSignIn(t, ctx, portal, b.xrdp.User, b.xrdp.Password, "desk")
	byName := []string{"accounts", "analytics", "billing", "build-farm", "cad", "desk"}
	waitShown(t, ctx, "before any launch", byName...)
	if text := read(chromedp.Text(chromedp.CSS("ul.desktops"))); strings.Contains(text, "Last used") {
		t.Fatalf("before any launch the page says %q", text)
	}
	shot(t, ctx, b.artifacts, "find-1-by-name")
	// Typing narrows the list at each key, with no request to the portal.
	must(chromedp.SendKeys(chromedp.ID("q"), "office"))
	waitShown(t, ctx, `after typing "office"`, "cad", "desk")
	if text := read(chromedp.Text(chromedp.ID("found"))); text != "2 of 6 desktops match “office”." {
		t.Fatalf(`after typing "office" the page says %q`, text)
	}
	must(chromedp.SendKeys(chromedp.ID("q"), " 3d"))
	waitShown(t, ctx, `after typing "office 3d"`, "cad")
	shot(t, ctx, b.artifacts, "find-2-typed")
	must(chromedp.SendKeys(chromedp.ID("q"), strings.Repeat(kb.Backspace, len("office 3d"))+"desk"))
	waitShown(t, ctx, `after typing "desk"`, "desk")
	// Launch desk: desk.rdp downloads.
	downloaded := downloadsCompleted(t, ctx)
	must(chromedp.Click(chromedp.CSS("li.desktop[data-group='desk'] button")))
	select {
	case <-downloaded:
	case <-time.After(20 * time.Second):
		ents, _ := os.ReadDir(downloads)
		t.Fatalf("no download completed; the folder holds %v", ents)
	}
	if st, err := os.Stat(filepath.Join(downloads, "desk.rdp")); err != nil || st.Size() == 0 {
		ents, _ := os.ReadDir(downloads)
		t.Fatalf("no desk.rdp downloaded; the folder holds %v", ents)
	}
	// Back to the portal: desk comes first, used just now.
	desk := chromedp.CSS("li.desktop[data-group='desk']")
	err := chromedp.Do(ctx, chromedp.Navigate(portal+"/"))
	if le := (*chromedp.LoadError)(nil); errors.As(err, &le) && le.ErrorText == "net::ERR_ABORTED" {
		// The browser may still be closing the launch's navigation,
		// which became the download, and drop this one for it (seen
		// once in a clean-clone run): the person clicks again.
		t.Logf("the portal's page load was aborted (%v); loading it again", err)
		err = chromedp.Do(ctx, chromedp.Navigate(portal+"/"))
	}
	if err != nil {
		t.Fatal(err)
	}
	must(chromedp.WaitVisible(desk))
	waitShown(t, ctx, "after desk's launch", "desk", "accounts", "analytics", "billing", "build-farm", "cad")
	if text := read(chromedp.Text(desk)); !strings.Contains(text, "Last used just now.") {
		t.Fatalf("after its launch desk reads %q", text)
	}
	shot(t, ctx, b.artifacts, "find-3-recent-first")
	// Without script: the search box is a form the portal answers.
	if _, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true}); err != nil {
		t.Fatal(err)
	}
	must(chromedp.Navigate(portal+"/"), chromedp.WaitVisible(chromedp.ID("q")), chromedp.SendKeys(chromedp.ID("q"), "BILLING"))
	// No script narrows the list as the person types...
	if got := shownDesktops(t, ctx); len(got) != 6 {
		t.Fatalf("with script off, typing narrowed the list to %v", got)
	}
	// ...and Enter asks the portal.
	must(chromedp.SendKeys(chromedp.ID("q"), "\n"))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		url := read(chromedp.Location())
		if url == portal+"/?q=BILLING" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the search without script went to %s", url)
		}
	}
	must(chromedp.WaitReady(chromedp.CSS("body")))
	waitShown(t, ctx, "without script, searching for BILLING,", "billing")
	if text := read(chromedp.Text(chromedp.ID("found"))); text != "1 of 6 desktops match “BILLING”. Show all" {
		t.Fatalf("without script the search says %q", text)
	}
	shot(t, ctx, b.artifacts, "find-4-without-script")
	must(chromedp.Click(chromedp.CSS("#found a")), chromedp.WaitNotVisible(chromedp.ID("found")))
	waitShown(t, ctx, "without script, after Show all,", "desk", "accounts", "analytics", "billing", "build-farm", "cad")
}

// downloadsCompleted returns a channel that receives once for each
// download the browser of ctx completes from now on (it sends the events
// once browser.SetDownloadBehavior has turned them on).
func downloadsCompleted(t *testing.T, ctx context.Context) <-chan struct{} {
	t.Helper()
	done := make(chan struct{}, 8)
	fn := func(ev any) {
		if p, ok := ev.(*browser.EventDownloadProgress); ok && p.State == browser.DownloadProgressStateCompleted {
			select {
			case done <- struct{}{}:
			default:
			}
		}
	}
	// Set on the page's session, the behaviour sends its events there.
	if err := chromedp.Listen(ctx, fn); err != nil {
		t.Fatal(err)
	}
	return done
}
