package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/testkit"
)

const consoleVDisksConfig = `state_dir: %[1]s
log: {level: info, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
tls: {cert: %[3]s, key: %[4]s}
auth:
  token_key: "e2e-token-key-0123456789abcdef0123456789"
  users:
  - {name: ada, password: "Ada-Admin-1", groups: [admins]}
broker:
  listen: "127.0.0.1:%[5]d"
  gateway: "127.0.0.1:3391"
  frontend_tokens: [e2e-portal-token]
  delivery_groups:
  - {name: desk, groups: [staff]}
stream:
  listen: "%[10]s:%[6]d"
  clients: open
  tls: "off"
  vdisks:
  - {name: golden, base: %[7]s, description: the office image}
  netboot: {interface: lo, address: %[10]s, dhcp: proxy, http_port: %[8]d}
web:
  listen: "127.0.0.1:%[9]d"
  console: {admins: [admins]}
`

// vdiskConsole is a deskway running the stream role, its admin API and
// the web console from a consoleVDisksConfig-shaped configuration, with
// a call of the admin API that fails the test on any error.
type vdiskConsole struct {
	srv    *testkit.Process
	portal string
	stream string // the stream server's address and port
	api    func(method, path, body string, out any)
}

// bootAddr is a loopback address of the test's own for deskway's boot
// services, which listen on it at TFTP's fixed port 69: on 127.0.0.1, a
// second deskway booting beside the first could not start.
func bootAddr() string {
	return fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(254), rand.IntN(256), 1+rand.IntN(254))
}

// startVDiskConsole starts deskway from config (consoleVDisksConfig or
// a variant; a 16 MiB empty golden image is its %[7]s) and waits for the
// console to listen.
func startVDiskConsole(t *testing.T, config string) vdiskConsole {
	t.Helper()
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	os.WriteFile(base, nil, 0o600)
	os.Truncate(base, 16<<20)
	_, _, cert, key := testkit.TLS(t)
	ports := testkit.FreePorts(t, 5) // FreePort twice may give the same
	adminPort, streamPort, webPort := ports[0], ports[1], ports[2]
	boot := bootAddr()
	cfg := filepath.Join(dir, "deskway.yaml")
	writeFile(t, cfg, fmt.Sprintf(config, filepath.Join(dir, "state"), adminPort, cert, key, ports[3], streamPort, base, ports[4], webPort, boot))
	srv := testkit.Start(t, nil, bin, "run", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", webPort), 20*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, lastLines(srv.Log.String(), 20))
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	api := func(method, path, body string, out any) {
		t.Helper()
		req, _ := http.NewRequest(method, fmt.Sprintf("https://127.0.0.1:%d%s", adminPort, path), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %s", method, path, resp.Status)
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatal(err)
			}
		}
	}
	return vdiskConsole{srv: srv, portal: fmt.Sprintf("https://127.0.0.1:%d", webPort), stream: fmt.Sprintf("%s:%d", boot, streamPort), api: api}
}

// TestConsoleVDiskActions: an admin in Chromium sees on the vDisks page
// which device runs which version, beside each version and each
// device; Delete and Demote ask first; the delete of a version a device
// runs, or production devices boot, is refused with the devices named;
// Demote reverts production to
// the version before; a collection is assigned, disabled (asked first)
// and enabled as one; once the device is gone and the collection
// boots production again, the version is deleted. No RDP is involved.
func TestConsoleVDiskActions(t *testing.T) {
	// Its deskway boots on a loopback address of its own (bootAddr), its
	// other ports the kernel chose; no RDP, no timing judged.
	parallel(t)
	ctx := newBrowser(t)
	r := startVDiskConsole(t, consoleVDisksConfig)
	srv, portal, stream, api := r.srv, r.portal, r.stream, r.api
	artifacts := filepath.Join("artifacts", t.Name())
	for n := 1; n <= 2; n++ {
		api("POST", "/api/v1/stream/vdisks/golden/versions", fmt.Sprintf(`{"note":"release %d"}`, n), nil)
		api("POST", fmt.Sprintf("/api/v1/stream/vdisks/golden/versions/%d/promote", n), "", nil)
		api("POST", fmt.Sprintf("/api/v1/stream/vdisks/golden/versions/%d/promote", n), "", nil)
	}
	api("POST", "/api/v1/stream/devices", `{"mac":"52:54:00:77:00:01","name":"pc1","collection":"lab","vdisk":"golden"}`, nil)
	api("POST", "/api/v1/stream/devices", `{"mac":"52:54:00:77:00:02","name":"pc2","collection":"lab","vdisk":"golden","disabled":true}`, nil)
	pc1, err := nbdclient.Dial(context.Background(), stream, "golden/pc1/b1", nbdclient.Options{})
	if err != nil {
		t.Fatal(err)
	}

	// Each step has 20 s: an element the page lacks fails the test
	// instead of waiting for it without end.
	read := func(a chromedp.Action[string]) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		v, err := chromedp.Run(sctx, a)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(v)
	}
	must := stepsOf(t, ctx, srv)
	must(chromedp.Navigate(portal+"/signin"), chromedp.WaitVisible(chromedp.ID("user")),
		chromedp.SendKeys(chromedp.ID("user"), "ada"), chromedp.SendKeys(chromedp.ID("password"), "Ada-Admin-1"),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")), chromedp.WaitVisible(chromedp.CSS("header nav")))
	page := func() {
		t.Helper()
		must(chromedp.Navigate(portal+"/admin/vdisks"), chromedp.WaitVisible(chromedp.CSS("section[data-vdisk='golden'] table")))
	}
	cell := func(sel string) string { t.Helper(); return read(chromedp.Text(chromedp.CSS(sel))) }
	// mark tags the page shown now, so that a wait after a click finds
	// the page the click brought and not a notice left from the one before.
	mark := func() {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.dataset.before = "1"; true`)); err != nil {
			t.Fatal(err)
		}
	}
	// click posts a form of the page and, when asked, confirms.
	click := func(form string, confirm bool, shotName string) {
		t.Helper()
		if !confirm {
			mark()
		}
		must(chromedp.Click(chromedp.CSS("form[action='" + form + "'] button")))
		if confirm {
			must(chromedp.WaitVisible(chromedp.CSS("section.confirm")))
			if shotName != "" {
				shot(t, ctx, artifacts, shotName)
			}
			mark()
			must(chromedp.Click(chromedp.CSS("section.confirm button")))
		}
		must(chromedp.WaitVisible(chromedp.CSS("html:not([data-before]) .notice, html:not([data-before]) .error")))
	}

	page()
	if got := cell("section[data-vdisk='golden'] tr[data-version='2'] td.running"); got != "pc1" {
		t.Fatalf("version 2 runs on %q, want pc1", got)
	}
	if got := cell("section[data-vdisk='golden'] tr[data-version='1'] td.running"); got != "–" {
		t.Fatalf("version 1 runs on %q, want nobody", got)
	}
	if got := cell("tr[data-device='pc1'] td.running"); got != "golden version 2" {
		t.Fatalf("pc1 runs %q, want golden version 2", got)
	}
	shot(t, ctx, artifacts, "console-vdisks-running")

	// A version a device runs is not deleted, and the page says who.
	click("/admin/vdisks/golden/versions/2/delete", true, "console-version-delete-confirm")
	if e := cell(".error"); !strings.Contains(e, "version 2 is what production clients of golden boot (devices pc1 (production), pc2 (production)): demote it first") {
		t.Fatalf("the delete of the version production devices boot: %q", e)
	}

	// Demote (revert): production devices boot version 1 again.
	page()
	click("/admin/vdisks/golden/versions/2/demote", true, "")
	if n := cell(".notice"); n != "Version demoted." {
		t.Fatalf("after Demote: %q", n)
	}
	if got := cell("section[data-vdisk='golden'] tr[data-version='2'] td.stage"); got != "test" {
		t.Fatalf("version 2's stage after Demote: %q", got)
	}
	click("/admin/vdisks/golden/versions/2/delete", true, "")
	if e := cell(".error"); !strings.Contains(e, "device pc1 is running version 2 of golden; it can be deleted once it has shut down") {
		t.Fatalf("the delete of the version pc1 runs: %q", e)
	}
	shot(t, ctx, artifacts, "console-version-delete-refused")
	page()

	// The collection as one: assigned to the test stage, disabled, enabled.
	must(chromedp.SetValue(chromedp.ID("stage-lab"), "test"))
	click("/admin/collections/lab/assign", true, "console-collection-assign-confirm")
	if n := cell(".notice"); !strings.HasPrefix(n, "Collection assigned") {
		t.Fatalf("after Assign: %q", n)
	}
	if got := cell("tr[data-device='pc2'] td.assigned"); got != "golden (test)" {
		t.Fatalf("pc2 after the collection's Assign: %q", got)
	}
	click("/admin/collections/lab/enable", false, "")
	if got := cell("tr[data-collection='lab'] td.enabled"); got != "2" {
		t.Fatalf("enabled devices of lab after Enable all: %q", got)
	}
	shot(t, ctx, artifacts, "console-collections")
	click("/admin/collections/lab/disable", true, "")
	if got := cell("tr[data-collection='lab'] td.disabled"); got != "2" {
		t.Fatalf("disabled devices of lab after Disable all: %q", got)
	}
	var devs struct{ Devices []map[string]any }
	api("GET", "/api/v1/stream/devices", "", &devs)
	for _, d := range devs.Devices {
		if d["stage"] != "test" || d["enabled"] != false {
			t.Fatalf("devices after the console's collection actions: %v", devs.Devices)
		}
	}

	// pc1 shuts down (a boot that wrote ends with its clean disconnect);
	// version 2 is still the lab's (test): refused, named.
	if err := pc1.WriteAt(make([]byte, 4096), 0, true); err != nil {
		t.Fatal(err)
	}
	pc1.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var bl struct{ Boots []any }
		api("GET", "/api/v1/stream/boots", "", &bl)
		if len(bl.Boots) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pc1's boot did not end with its disconnect")
		}
	}
	page()
	click("/admin/vdisks/golden/versions/2/delete", true, "")
	if e := cell(".error"); !strings.Contains(e, "devices pc1 (test), pc2 (test) are assigned to vDisk golden") {
		t.Fatalf("the delete of the version the lab is assigned to: %q", e)
	}
	page()
	must(chromedp.SetValue(chromedp.ID("stage-lab"), ""))
	click("/admin/collections/lab/assign", true, "")
	click("/admin/vdisks/golden/versions/2/delete", true, "")
	if n := cell(".notice"); n != "Version deleted." {
		t.Fatalf("after Delete: %q", n)
	}
	shot(t, ctx, artifacts, "console-version-deleted")
	var vs struct{ Versions []map[string]any }
	api("GET", "/api/v1/stream/vdisks/golden/versions", "", &vs)
	if len(vs.Versions) != 2 {
		t.Fatalf("versions after the console's delete: %v", vs.Versions)
	}
	var al struct{ Entries []map[string]any }
	api("GET", "/api/v1/audit?limit=100", "", &al)
	found := map[string]bool{}
	for _, e := range al.Entries {
		if strings.Contains(fmt.Sprint(e["actor"]), "ada") {
			found[fmt.Sprint(e["action"])] = true
		}
	}
	for _, a := range []string{"POST /api/v1/stream/vdisks/golden/versions/2/demote", "DELETE /api/v1/stream/vdisks/golden/versions/2",
		"POST /api/v1/stream/collections/lab/assign", "POST /api/v1/stream/collections/lab/disable", "POST /api/v1/stream/collections/lab/enable"} {
		if !found[a] {
			t.Errorf("the audit trail lacks %s under ada's name: %v", a, found)
		}
	}
}
