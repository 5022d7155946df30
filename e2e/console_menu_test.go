package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestConsoleBootMenu: an admin in Chromium sets pc1's boot menu on the
// vDisks page and sees it in pc1's row; a menu naming a vDisk that does
// not exist is refused in words and pc1 keeps its menu; collection lab's
// form sets the menu of both its devices. The admin API gives back what
// the page showed.
func TestConsoleBootMenu(t *testing.T) {
	// As TestConsoleVDiskActions: a boot address of its own, no RDP.
	parallel(t)
	ctx := newBrowser(t)
	two := strings.Replace(consoleVDisksConfig, "  netboot:", "  - {name: other, base: %[7]s}\n  netboot:", 1)
	r := startVDiskConsole(t, two)
	srv, portal, api := r.srv, r.portal, r.api
	artifacts := filepath.Join("artifacts", t.Name())
	api("POST", "/api/v1/stream/devices", `{"mac":"52:54:00:77:00:01","name":"pc1","collection":"lab","vdisk":"golden"}`, nil)
	api("POST", "/api/v1/stream/devices", `{"mac":"52:54:00:77:00:02","name":"pc2","collection":"lab","vdisk":"golden"}`, nil)

	must := stepsOf(t, ctx, srv)
	cell := func(sel string) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		v, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(v)
	}
	// submit fills a menu form's fields and posts it, then waits for the page the
	// post brought (the page before is marked, so its notice is not it).
	submit := func(form, entries, def, timeout string) {
		t.Helper()
		f := "form[action='" + form + "'] "
		must(chromedp.WaitVisible(chromedp.CSS(f + "button")))
		fill := fmt.Sprintf(`(() => { const f = document.querySelector(%q); f.entries.value = %q; f.default.value = %q; f.timeout.value = %q;
			document.documentElement.dataset.before = "1"; return true })()`, "form[action='"+form+"']", entries, def, timeout)
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fill)); err != nil {
			t.Fatal(err)
		}
		must(chromedp.Click(chromedp.CSS(f+"button")), chromedp.WaitVisible(chromedp.CSS("html:not([data-before]) .notice, html:not([data-before]) .error")))
	}
	must(chromedp.Navigate(portal+"/signin"), chromedp.WaitVisible(chromedp.ID("user")),
		chromedp.SendKeys(chromedp.ID("user"), "ada"), chromedp.SendKeys(chromedp.ID("password"), "Ada-Admin-1"),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")), chromedp.WaitVisible(chromedp.CSS("header nav")))
	must(chromedp.Navigate(portal+"/admin/vdisks"), chromedp.WaitVisible(chromedp.CSS("tr[data-device='pc1']")))
	if got := cell("tr[data-device='pc1'] td.menu"); got != "–" {
		t.Fatalf("pc1's menu before any: %q", got)
	}
	submit("/admin/devices/pc1/menu", "golden other", "other", "7")
	if n := cell(".notice"); n != "Boot menu set: it shows from the next power-on." {
		t.Fatalf("after Set menu: %q", n)
	}
	if got := cell("tr[data-device='pc1'] td.menu"); got != "golden, other (default other, 7 s)" {
		t.Fatalf("pc1's menu: %q", got)
	}
	shot(t, ctx, artifacts, "console-boot-menu")
	submit("/admin/devices/pc1/menu", "golden nothere", "", "5")
	if e := cell(".error"); !strings.Contains(e, `boot menu entry "nothere": no vDisk "nothere" in stream.vdisks`) {
		t.Fatalf("a menu naming no vDisk: %q", e)
	}
	must(chromedp.Navigate(portal+"/admin/vdisks"), chromedp.WaitVisible(chromedp.CSS("tr[data-device='pc1']")))
	submit("/admin/collections/lab/menu", "other golden", "", "")
	for _, d := range []string{"pc1", "pc2"} {
		if got := cell("tr[data-device='" + d + "'] td.menu"); got != "other, golden (default other, 10 s)" {
			t.Fatalf("%s's menu after the collection's: %q", d, got)
		}
	}
	var devs struct {
		Devices []struct {
			Name string
			Menu struct {
				Entries []string
				Timeout int
			}
		}
	}
	api("GET", "/api/v1/stream/devices", "", &devs)
	for _, d := range devs.Devices {
		if strings.Join(d.Menu.Entries, ",") != "other,golden" || d.Menu.Timeout != 10 {
			t.Fatalf("devices after the console's menus: %+v", devs.Devices)
		}
	}
}
