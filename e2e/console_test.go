package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/agent"
	"github.com/deskway/deskway/internal/testkit"
)

// testConsoleInBrowser is an administrator and a helpdesk agent at the
// admin console in chromium, with a real xrdp session open through the
// gateway: the dashboard counts it, the hosts and sessions pages show
// the memory and CPU the agent reads of it, the admin drains the host and
// disconnects the tunnel (both visible in the admin API and in the audit
// trail under the admin's name), and the helpdesk agent sees no drain
// and is refused one.
func testConsoleInBrowser(t *testing.T, xs testkit.XRDPSetup) {
	ctx := newBrowser(t)
	ports := testkit.FreePorts(t, 3) // FreePort twice may give the same
	webPort, streamPort := ports[0], ports[1]
	base := filepath.Join(t.TempDir(), "golden.img")
	if err := os.WriteFile(base, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(base, 16<<20); err != nil {
		t.Fatal(err)
	}
	boot := bootAddr()
	b := newBrokerRigWith(t, xs, func(cfg string) string {
		// Network boot on loopback, for the devices list (the boot tests
		// run it for real in a network namespace).
		cfg += fmt.Sprintf("stream:\n  listen: \"%[1]s:%[2]d\"\n  clients: open\n  tls: \"off\"\n  vdisks:\n  - {name: golden, base: %[3]s, description: the office image}\n"+
			"  netboot: {interface: lo, address: %[1]s, dhcp: proxy, http_port: %[4]d}\n", boot, streamPort, base, ports[2])
		cfg = strings.Replace(cfg, "broker:\n", "broker:\n  frontend_tokens: [e2e-portal-token]\n", 1)
		cfg = strings.Replace(cfg, "  users:\n", "  users:\n  - {name: ada, password: \"Ada-Admin-1\", groups: [admins]}\n  - {name: hal, password: \"Hal-Help-1\", groups: [helpdesk]}\n", 1)
		return cfg + fmt.Sprintf("web:\n  listen: \"127.0.0.1:%d\"\n  console: {admins: [admins], helpdesk: [helpdesk]}\n", webPort)
	})
	portal := fmt.Sprintf("https://127.0.0.1:%d", webPort)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", webPort), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	// A user's session through the gateway, left open.
	lr := b.launch()
	rdp := filepath.Join(b.dir, "desk.rdp")
	if err := os.WriteFile(rdp, []byte(lr.RDP), 0o600); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := exec.CommandContext(cctx, "xfreerdp", rdp, "/cert:ignore", "/u:"+b.xrdp.User, "/p:"+b.xrdp.Password, "/size:800x600", "/gt:http")
	client.Env = append(os.Environ(), "DISPLAY="+b.display)
	client.Stdin = strings.NewReader("y\n")
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- client.Wait() }()
	b.waitState("active")

	api := func(path string, out any) {
		t.Helper()
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d%s", b.adminPort, path), nil)
		req.Header.Set("Authorization", "Bearer e2e-admin-token")
		resp, err := b.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
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
	must := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := doLive(ctx, steps...); err != nil {
			t.Fatalf("%v\n%s", err, lastLines(b.gwLog.Log.String(), 20))
		}
	}
	signIn := func(user, pw string) {
		t.Helper()
		must(chromedp.Navigate(portal+"/signin"), chromedp.WaitVisible(chromedp.ID("user")),
			chromedp.SendKeys(chromedp.ID("user"), user), chromedp.SendKeys(chromedp.ID("password"), pw),
			chromedp.Click(chromedp.CSS("form[action='/signin'] button")), chromedp.WaitVisible(chromedp.CSS("header nav")),
			chromedp.Navigate(portal+"/admin/"), chromedp.WaitVisible(chromedp.CSS(".counts")))
	}

	// The agent reads the session's processes from the process tree
	// under its xrdp-sesman: all of the user's, the X server among them,
	// and reports their memory with the session.
	var mine agent.SessionUsage
	var readAt time.Time
	for try := 0; ; try++ {
		readAt = time.Now()
		usage, err := agent.ReadSessionUsage("/proc")
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range usage {
			if u.User == b.xrdp.User {
				mine = u
			}
		}
		procs := running(t, b.xrdp.User)
		if mine.PSSBytes > 1<<20 && mine.Processes >= 2 && mine.Processes == len(procs) {
			t.Logf("the session: %+v\n%s", mine, strings.Join(procs, "\n"))
			break
		}
		if try == 5 {
			t.Fatalf("the session's usage %+v (all %+v); the user runs %d processes:\n%s", mine, usage, len(procs), strings.Join(procs, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The sessions are read once the broker has had two heartbeats after
	// the test's reading: the agent reads a heartbeat's usage before it
	// sends it, so the first may carry a reading older than the test's
	// (from a session still starting: 12.9 MB against the test's 50 MB
	// once), the second was read after the first arrived.
	var sessions []map[string]any
	seen := func() time.Time {
		t.Helper()
		var hosts []struct {
			LastSeen time.Time `json:"last_seen"`
		}
		api("/api/v1/broker/hosts", &hosts)
		if len(hosts) != 1 {
			t.Fatalf("the admin API lists %d hosts, want 1", len(hosts))
		}
		return hosts[0].LastSeen
	}
	var first time.Time
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		if first.IsZero() {
			if at := seen(); at.After(readAt) {
				first = at
			}
		} else if seen().After(first) {
			api("/api/v1/broker/sessions?user="+b.xrdp.User, &sessions)
			if len(sessions) == 1 && sessions[0]["memory_bytes"].(float64) > 1<<20 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admin API's sessions carry no memory from an agent's heartbeat after the test's reading: %v", sessions)
		}
	}
	// The heartbeat carried the agent's reading: memory moves a little
	// between readings, a wrong unit or process set would move it far.
	if got := sessions[0]["memory_bytes"].(float64); got < float64(mine.PSSBytes)/2 || got > 2*float64(mine.PSSBytes) {
		t.Fatalf("the broker has the session's memory as %.0f bytes, the agent's reading is %d", got, mine.PSSBytes)
	}
	var hosts []map[string]any
	api("/api/v1/broker/hosts", &hosts)
	if len(hosts) != 1 || hosts[0]["session_memory_bytes"].(float64) <= 1<<20 || hosts[0]["major_faults_per_s"] == nil || hosts[0]["swap_out_per_s"] == nil {
		t.Fatalf("the admin API's hosts: %v", hosts)
	}

	signIn("ada", "Ada-Admin-1")
	counts := strings.Join(strings.Fields(read(chromedp.Text(chromedp.CSS(".counts")))), " ")
	if !strings.Contains(counts, "1 tunnels") || !strings.Contains(counts, "1 live sessions") || !strings.Contains(counts, "1 hosts") {
		t.Fatalf("the dashboard counts %q", counts)
	}
	charts, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll(".charts li svg polyline").length`))
	if err != nil || charts != 4 {
		t.Fatalf("the dashboard draws %d charts (%v), want 4", charts, err)
	}
	shot(t, ctx, b.artifacts, "console-1-dashboard")
	must(chromedp.Navigate(portal+"/admin/sessions"), chromedp.WaitVisible(chromedp.CSS("tr[data-session] td.memory")))
	if m, c := read(chromedp.Text(chromedp.CSS("tr[data-session] td.memory"))), read(chromedp.Text(chromedp.CSS("tr[data-session] td.cpu"))); !strings.HasSuffix(m, " MiB") && !strings.HasSuffix(m, " GiB") || !strings.HasSuffix(c, "%") {
		t.Fatalf("the sessions page shows memory %q and CPU %q", m, c)
	}
	shot(t, ctx, b.artifacts, "console-1b-sessions")
	// Log off asks first; Cancel leaves the session alone.
	must(chromedp.Click(chromedp.CSS("tr[data-session] form[action$='/logoff'] button")), chromedp.WaitVisible(chromedp.CSS("section.confirm")))
	if q := read(chromedp.Text(chromedp.CSS("section.confirm h1"))); q != "Log "+b.xrdp.User+" off xrdp-host?" {
		t.Fatalf("Log off asks %q", q)
	}
	shot(t, ctx, b.artifacts, "console-1c-logoff-confirm")
	must(chromedp.Click(chromedp.CSS("section.confirm a")), chromedp.WaitVisible(chromedp.CSS("tr[data-session] td.state")))
	if st := b.sessionState(); st != "active" {
		t.Fatalf("after Log off was cancelled the session is %s", st)
	}
	// Drain the host.
	must(chromedp.Navigate(portal+"/admin/hosts"), chromedp.WaitVisible(chromedp.CSS("tr[data-host='xrdp-host']")))
	if m := read(chromedp.Text(chromedp.CSS("tr[data-host='xrdp-host'] td.session-memory"))); !strings.HasSuffix(m, " MiB") && !strings.HasSuffix(m, " GiB") {
		t.Fatalf("the hosts page shows memory per session %q", m)
	}
	if f, sw := read(chromedp.Text(chromedp.CSS("tr[data-host='xrdp-host'] td.faults"))), read(chromedp.Text(chromedp.CSS("tr[data-host='xrdp-host'] td.swap"))); f == "" || !strings.Contains(sw, " / ") {
		t.Fatalf("the hosts page shows major faults %q and swap %q", f, sw)
	}
	shot(t, ctx, b.artifacts, "console-2-hosts")
	// Drain, undrain and drain again: the audit trail tells them apart.
	// Each waits for the other's button, which only the page after it
	// shows: the page before has a notice too.
	next := map[string]string{"drain": "undrain", "undrain": "drain"}
	for _, verb := range []string{"drain", "undrain", "drain"} {
		must(chromedp.Click(chromedp.CSS("form[action='/admin/hosts/xrdp-host/"+verb+"'] button")),
			chromedp.WaitVisible(chromedp.CSS("form[action='/admin/hosts/xrdp-host/"+next[verb]+"'] button")))
		if n := read(chromedp.Text(chromedp.CSS(".notice"))); !strings.Contains(n, "Host "+verb+"ed.") {
			t.Fatalf("after %s the page says %q", verb, n)
		}
	}
	if st := read(chromedp.Text(chromedp.CSS("tr[data-host='xrdp-host'] td.status"))); !strings.Contains(st, "drain") {
		t.Fatalf("the drained host's status reads %q", st)
	}
	shot(t, ctx, b.artifacts, "console-3-host-drained")
	api("/api/v1/broker/hosts", &hosts)
	if len(hosts) != 1 || hosts[0]["admin_drain"] != true {
		t.Fatalf("the admin API shows hosts %v after the console's drain", hosts)
	}
	// The sessions page stays open in this tab while another tab
	// disconnects the tunnel (asking first): the session's state changes
	// on the open page, which was not loaded again.
	must(chromedp.Navigate(portal+"/admin/sessions"), chromedp.WaitVisible(chromedp.CSS("tr[data-session] td.state")))
	if st := read(chromedp.Text(chromedp.CSS("tr[data-session] td.state"))); st != "active" {
		t.Fatalf("the open sessions page shows %q before the disconnect", st)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.samePage = true`)); err != nil {
		t.Fatal(err)
	}
	other, closeOther := chromedp.NewContext(ctx)
	defer closeOther()
	if err := chromedp.Do(other, chromedp.Navigate(portal+"/admin/tunnels"), chromedp.WaitVisible(chromedp.CSS("tr[data-tunnel]"))); err != nil {
		t.Fatal(err)
	}
	shot(t, other, b.artifacts, "console-4-tunnels")
	if err := doLive(other, chromedp.Click(chromedp.CSS("tr[data-tunnel] form button")), chromedp.WaitVisible(chromedp.CSS("section.confirm"))); err != nil {
		t.Fatal(err)
	}
	shot(t, other, b.artifacts, "console-4a-tunnel-confirm")
	if err := doLive(other, chromedp.Click(chromedp.CSS("section.confirm button")), chromedp.WaitVisible(chromedp.CSS(".notice"))); err != nil {
		t.Fatal(err)
	}
	// The .rdp file turns xfreerdp's auto-reconnect on: it tries again,
	// each try refused, until its retries run out. Beside other tests,
	// at a load of 14, it still tried 16 s after the disconnect.
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatal("xfreerdp still runs 60 s after the console disconnected its tunnel")
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		// Read in one evaluation: the live update may replace the row
		// between finding its node and reading it.
		st, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector("tr[data-session] td.state") || {}).textContent || ""`))
		st = strings.TrimSpace(st)
		same, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.samePage === true`))
		if err != nil || !same {
			t.Fatalf("the sessions page was loaded again (%v)", err)
		}
		if st == "disconnected" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the open sessions page still shows %q 15 s after the disconnect (the broker has %s)", st, b.sessionState())
		}
	}
	shot(t, ctx, b.artifacts, "console-4b-sessions-live")
	var tl struct{ Tunnels []map[string]any }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		api("/api/v1/gateway/tunnels", &tl)
		if len(tl.Tunnels) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tunnels after the console's disconnect: %v", tl.Tunnels)
		}
	}
	// The audit trail names the admin, in the API and on the page.
	var al struct{ Entries []map[string]any }
	api("/api/v1/audit?limit=50", &al)
	found := map[string]bool{}
	for _, e := range al.Entries {
		if strings.Contains(fmt.Sprint(e["actor"]), "admin, web console: ada") {
			found[fmt.Sprint(e["action"])] = true
		}
	}
	if !found["POST /api/v1/broker/hosts/xrdp-host/drain"] || !found["POST /api/v1/broker/hosts/xrdp-host/undrain"] || len(found) != 3 {
		t.Fatalf("the audit trail under ada's name: %v\n%v", found, al.Entries)
	}
	must(chromedp.Navigate(portal+"/admin/audit"), chromedp.WaitVisible(chromedp.CSS("table")))
	if page := read(chromedp.Text(chromedp.CSS("table"))); !strings.Contains(page, "POST /api/v1/broker/hosts/xrdp-host/drain") || !strings.Contains(page, "POST /api/v1/broker/hosts/xrdp-host/undrain") {
		t.Fatalf("the audit page lacks the drain or the undrain:\n%s", page)
	}
	shot(t, ctx, b.artifacts, "console-5-audit")
	// Delivery groups with their entitlements, and the vDisks with a
	// version made for maintenance, which the admin promotes.
	must(chromedp.Navigate(portal+"/admin/groups"), chromedp.WaitVisible(chromedp.CSS("tr[data-group='desk']")))
	if g := read(chromedp.Text(chromedp.CSS("tr[data-group='desk']"))); !strings.Contains(g, "staff") || !strings.Contains(g, "the configuration") {
		t.Fatalf("the desk group reads %q", g)
	}
	// The admin entitles herself to desk: her portal page shows it, the
	// admin API and the audit trail say who did it; then she brings the
	// configuration's entitlement back and the desktop is gone again.
	hasDesk := func() bool {
		t.Helper()
		must(chromedp.Navigate(portal+"/"), chromedp.WaitVisible(chromedp.CSS("form.signout button")))
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("[data-group='desk']").length`))
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if hasDesk() {
		t.Fatal("ada (admins) sees desk before she is entitled to it")
	}
	must(chromedp.Navigate(portal+"/admin/groups"), chromedp.WaitVisible(chromedp.ID("users-desk")),
		chromedp.SetValue(chromedp.ID("users-desk"), "ada"),
		chromedp.Click(chromedp.CSS("form[action='/admin/groups/desk/entitlements'] button")), chromedp.WaitVisible(chromedp.CSS(".notice")))
	if n := read(chromedp.Text(chromedp.CSS(".notice"))); !strings.Contains(n, "Entitlements saved") {
		t.Fatalf("after Save the page says %q", n)
	}
	if g := read(chromedp.Text(chromedp.CSS("tr[data-group='desk']"))); !strings.Contains(g, "ada") || !strings.Contains(g, "set by console token 1 for admin, web console: ada") {
		t.Fatalf("the desk group after Save reads %q", g)
	}
	shot(t, ctx, b.artifacts, "console-5b-groups-entitled")
	var groups []map[string]any
	api("/api/v1/broker/groups", &groups)
	if len(groups) != 1 || groups[0]["entitlements_from"] != "admin" || fmt.Sprint(groups[0]["users"]) != "[ada]" || fmt.Sprint(groups[0]["groups"]) != "[staff]" {
		t.Fatalf("the admin API shows groups %v after the console's change", groups)
	}
	if !hasDesk() {
		t.Fatal("ada does not see desk after the console entitled her")
	}
	shot(t, ctx, b.artifacts, "console-5c-portal-after-entitlement")
	must(chromedp.Navigate(portal+"/admin/groups"), chromedp.WaitVisible(chromedp.CSS("form[action='/admin/groups/desk/entitlements/clear'] button")),
		chromedp.Click(chromedp.CSS("form[action='/admin/groups/desk/entitlements/clear'] button")), chromedp.WaitVisible(chromedp.CSS(".notice")))
	if g := read(chromedp.Text(chromedp.CSS("tr[data-group='desk']"))); strings.Contains(g, "ada") || !strings.Contains(g, "the configuration") {
		t.Fatalf("the desk group after going back to the configuration reads %q", g)
	}
	if hasDesk() {
		t.Fatal("ada still sees desk after the configuration's entitlement is back")
	}
	api("/api/v1/audit?limit=50", &al)
	found = map[string]bool{}
	for _, e := range al.Entries {
		if strings.Contains(fmt.Sprint(e["actor"]), "admin, web console: ada") {
			found[fmt.Sprint(e["action"])] = true
		}
	}
	if !found["PUT /api/v1/broker/groups/desk/entitlements"] || !found["DELETE /api/v1/broker/groups/desk/entitlements"] {
		t.Fatalf("the audit trail lacks the entitlement changes under ada's name: %v", found)
	}
	req, _ := http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/stream/vdisks/golden/versions", b.adminPort), strings.NewReader(`{"note":"patch Tuesday"}`))
	req.Header.Set("Authorization", "Bearer e2e-admin-token")
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.hc.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("new vDisk version: %v %v", err, resp)
	}
	resp.Body.Close()
	req, _ = http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/stream/devices", b.adminPort), strings.NewReader(`{"mac":"52:54:00:77:00:01","name":"pc1","collection":"office","vdisk":"golden"}`))
	req.Header.Set("Authorization", "Bearer e2e-admin-token")
	req.Header.Set("Content-Type", "application/json")
	if resp, err = b.hc.Do(req); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("device add: %v %v", err, resp)
	}
	resp.Body.Close()
	must(chromedp.Navigate(portal+"/admin/vdisks"), chromedp.WaitVisible(chromedp.CSS("section[data-vdisk='golden'] table")))
	shot(t, ctx, b.artifacts, "console-5a-vdisks")
	// The admin disables a network-booted device; the admin API says so.
	if st := read(chromedp.Text(chromedp.CSS("tr[data-device='pc1'] td.state"))); st != "enabled" {
		t.Fatalf("pc1's state reads %q", st)
	}
	must(chromedp.Click(chromedp.CSS("form[action='/admin/devices/pc1/disable'] button")), chromedp.WaitVisible(chromedp.CSS(".notice")))
	if st := read(chromedp.Text(chromedp.CSS("tr[data-device='pc1'] td.state"))); st != "disabled" {
		t.Fatalf("pc1's state after Disable reads %q", st)
	}
	shot(t, ctx, b.artifacts, "console-5d-device-disabled")
	var devs struct{ Devices []map[string]any }
	api("/api/v1/stream/devices", &devs)
	if len(devs.Devices) != 1 || devs.Devices[0]["enabled"] != false {
		t.Fatalf("devices after the console's disable: %v", devs.Devices)
	}
	must(chromedp.Navigate(portal+"/admin/vdisks"), chromedp.WaitVisible(chromedp.CSS("section[data-vdisk='golden'] table")))
	must(chromedp.Click(chromedp.CSS("form[action='/admin/vdisks/golden/versions/1/promote'] button")), chromedp.WaitVisible(chromedp.CSS(".notice")))
	var vs struct{ Versions []map[string]any }
	api("/api/v1/stream/vdisks/golden/versions", &vs)
	promoted := false
	for _, v := range vs.Versions {
		promoted = promoted || fmt.Sprint(v["version"]) == "1" && v["stage"] == "test"
	}
	if !promoted {
		t.Fatalf("after the console's promote (maintenance to test) the versions are %v", vs.Versions)
	}
	// Helpdesk: sessions yes, drain no.
	must(chromedp.Navigate(portal+"/"), chromedp.WaitVisible(chromedp.CSS("form.signout button")),
		chromedp.Click(chromedp.CSS("form.signout button")), chromedp.WaitVisible(chromedp.ID("user")))
	signIn("hal", "Hal-Help-1")
	must(chromedp.Navigate(portal+"/admin/hosts"), chromedp.WaitVisible(chromedp.CSS("tr[data-host='xrdp-host']")))
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("`+sel+`").length`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count("tr[data-host='xrdp-host'] td"); n == 0 {
		t.Fatal("the hosts page shows no host to check for buttons")
	}
	if n := count("tr[data-host='xrdp-host'] button"); n != 0 {
		t.Fatalf("helpdesk sees %d buttons on a host", n)
	}
	shot(t, ctx, b.artifacts, "console-6-helpdesk-hosts")
	// A drain posted by hand (a form the page does not offer) is refused.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`(() => { const f = document.createElement("form"); f.method = "post"; f.action = "/admin/hosts/xrdp-host/undrain";
		const c = document.createElement("input"); c.name = "csrf"; c.value = document.querySelector("input[name=csrf]").value; f.appendChild(c);
		document.body.appendChild(f); f.submit(); })()`)); err != nil {
		t.Fatal(err)
	}
	must(chromedp.WaitVisible(chromedp.CSS(".error")))
	if e := read(chromedp.Text(chromedp.CSS(".error"))); !strings.Contains(e, "Your role (helpdesk) may not undrain hosts") {
		t.Fatalf("helpdesk's undrain: %q", e)
	}
	api("/api/v1/broker/hosts", &hosts)
	if hosts[0]["admin_drain"] != true {
		t.Fatal("helpdesk undrained the host")
	}
	must(chromedp.Navigate(portal+"/admin/sessions"), chromedp.WaitVisible(chromedp.CSS("table")))
	shot(t, ctx, b.artifacts, "console-7-helpdesk-sessions")
	// Helpdesk sees the entitlements but no form to change them, and one
	// posted by hand is refused.
	must(chromedp.Navigate(portal+"/admin/groups"), chromedp.WaitVisible(chromedp.CSS("tr[data-group='desk']")))
	if n := count("section.entitle"); n != 0 {
		t.Fatalf("helpdesk sees %d entitlement forms", n)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[any](`(() => { const f = document.createElement("form"); f.method = "post"; f.action = "/admin/groups/desk/entitlements";
		for (const [k, v] of [["csrf", document.querySelector("input[name=csrf]").value], ["users", "hal"]]) { const i = document.createElement("input"); i.name = k; i.value = v; f.appendChild(i); }
		document.body.appendChild(f); f.submit(); })()`)); err != nil {
		t.Fatal(err)
	}
	must(chromedp.WaitVisible(chromedp.CSS(".error")))
	if e := read(chromedp.Text(chromedp.CSS(".error"))); !strings.Contains(e, "Your role (helpdesk) may not change entitlements") {
		t.Fatalf("helpdesk's entitlement change: %q", e)
	}
	api("/api/v1/broker/groups", &groups)
	if groups[0]["entitlements_from"] != "configuration" {
		t.Fatalf("helpdesk changed the entitlements: %v", groups)
	}
}

// doLive runs steps on a console page, whose live part the page brings
// up to date every few seconds (static/live.js). The refresh keeps the
// elements that stay, but a row whose session or host changed is a new
// one: a click whose element was found just before finds it gone ("Could
// not find node with given id", "No node with given id found"), before
// any mouse event is sent; the steps then run again on the fresh row, as
// a person clicks again.
func doLive(ctx context.Context, steps ...chromedp.Action[chromedp.Void]) error {
	gone := func(err error) bool {
		return err != nil && (strings.Contains(err.Error(), "Could not find node with given id") || strings.Contains(err.Error(), "No node with given id found"))
	}
	err := chromedp.Do(ctx, steps...)
	for try := 0; gone(err) && try < 3; try++ {
		err = chromedp.Do(ctx, steps...)
	}
	return err
}
