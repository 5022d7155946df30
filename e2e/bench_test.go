package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/testkit"
)

// TestGatewayBenchSmoke runs a tiny version of `deskway bench gateway`
// (few tunnels, short windows) against the real gateway, echo server and
// HAProxy, and checks the result has the shape docs/benchmarks expects.
// It asserts correctness only, never timing. Its 24 ramps (kw1, kw2, the
// CPU counts and the farm, each system twice) are almost all waiting, so
// each is two steps: 10 tunnels, and the equal-load step of 20. Their
// warm-up and window stay: with half a second of window after a tenth
// of warm-up, HAProxy's p99 at 10 tunnels (the largest of some 50
// round trips) passed 40 ms in both runs at a load of 33, and its kw1
// ratio went missing.
func TestGatewayBenchSmoke(t *testing.T) {
	testkit.Require(t, "haproxy", "taskset")
	out := t.TempDir()
	res := runBench(t, out, "gateway", "--scenario", "kw1,kw2,cpus,farm,throughput", "--steps", "10",
		"--warmup", "300ms", "--window", "1s", "--throughput-duration", "500ms", "--runs", "2", "--cpu-loads", "20")
	if res.Bench != "gateway" || res.Machine.CPUs == 0 || res.Command == "" {
		t.Fatalf("header: %+v", res)
	}
	for _, k := range []string{"kw1_max_tunnels_40ms", "direct_kw1_max_tunnels_40ms", "haproxy_kw1_max_tunnels_40ms", "kw2_max_tunnels_40ms",
		"direct_kw2_max_tunnels_40ms", "kw1_cpu_us_per_roundtrip", "haproxy_kw1_cpu_us_per_roundtrip", "bytes_per_tunnel",
		"throughput_single_gbps", "throughput_single_ratio_direct", "throughput_multi_gbps", "throughput_multi_ratio_direct",
		"farm_failover_tunnels_lost", "farm_failover_recover_seconds",
		// The equal-load comparison (20 tunnels, a step added to the ramp)
		// and ratios taken within each run, with their worst run.
		"kw1_cpu_us_per_roundtrip_at_20", "haproxy_kw1_cpu_us_per_roundtrip_at_20", "haproxy_bytes_per_tunnel",
		"kw1_cpu_ratio_haproxy_at_20_median", "kw1_cpu_ratio_haproxy_at_20_worst", "kw1_ratio_haproxy_median", "kw1_ratio_haproxy_worst",
		"throughput_multi_ratio_haproxy_median", "throughput_multi_ratio_haproxy_worst"} {
		if _, ok := res.Summary[k]; !ok {
			t.Errorf("summary lacks %s", k)
		}
	}
	// Every system is held to one TLS cipher suite, and the result says
	// which; every system ran the repeated scenarios equally often.
	if res.Summary["kw1_cpu_runs_at_20"] != 2 || res.Summary["haproxy_kw1_cpu_runs_at_20"] != 2 {
		t.Errorf("equal-load CPU not measured in both runs of both relays: %v", res.Summary)
	}
	suites := map[string]any{}
	runs := map[string]map[any]bool{}
	seen := map[string]bool{}
	for _, p := range res.Points {
		if p.Skipped != "" {
			t.Errorf("%s/%s skipped: %s", p.Scenario, p.System, p.Skipped)
		}
		seen[p.Scenario+"/"+p.System] = true
		if p.Scenario == "tls" {
			suites[p.System] = p.Params["negotiated"]
		}
		if p.Scenario == "kw1-summary" || p.Scenario == "kw2-summary" || p.Scenario == "throughput" {
			if p.System == "paper" {
				continue
			}
			k := p.Scenario + "/" + p.System
			if runs[k] == nil {
				runs[k] = map[any]bool{}
			}
			runs[k][p.Params["run"]] = true
		}
		if p.Scenario == "kw1" && p.System == "deskway" && p.Metrics["round_trips"] <= 0 {
			t.Errorf("deskway kw1 point without round trips: %+v", p)
		}
		// 10 and 20 tunnels are far below any system's limit: every
		// round trip must come back, and repeat what was sent (the load
		// generator checks every answered byte and counts a wrong one as
		// an error), so no system earns a figure by answering wrongly.
		if (p.Scenario == "kw1" || p.Scenario == "kw2") && (p.Metrics["errors"] != 0 || p.Metrics["missing"] != 0) {
			t.Errorf("%s/%s with %v tunnels: %v errors, %v tunnels missing", p.Scenario, p.System, p.Metrics["tunnels"], p.Metrics["errors"], p.Metrics["missing"])
		}
	}
	for _, sys := range []string{"direct", "deskway", "haproxy"} {
		if suites[sys] != "TLS 1.3 TLS_AES_128_GCM_SHA256" {
			t.Errorf("%s negotiated %v", sys, suites[sys])
		}
		for _, sc := range []string{"kw1-summary", "kw2-summary", "throughput"} {
			if len(runs[sc+"/"+sys]) != 2 {
				t.Errorf("%s ran %s %d times, want 2", sys, sc, len(runs[sc+"/"+sys]))
			}
		}
	}
	for _, k := range []string{"kw1/direct", "kw1/deskway", "kw1/haproxy", "kw1-summary/paper", "throughput/deskway", "throughput/haproxy", "farm-failover/deskway-2node", "cpus/deskway"} {
		if !seen[k] {
			t.Errorf("no point for %s", k)
		}
	}
	// With 10 and 20 tunnels on a healthy gateway, nothing may be lost
	// except the tunnels of the node the failover test kills.
	if res.Summary["farm_failover_tunnels_lost"] <= 0 || res.Summary["farm_failover_recover_seconds"] <= 0 {
		t.Errorf("failover did not lose and recover tunnels: %v", res.Summary)
	}
	for _, f := range []string{"result.md", "response-kw1.svg", "throughput.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing or empty", f)
		}
	}
}

// TestBootstormBenchSmoke runs a tiny `deskway bench bootstorm` against
// deskway, every peer (nbd-server, nbdkit, qemu-nbd) and the floor, and checks the
// result's shape. Correctness only, never timing.
func TestBootstormBenchSmoke(t *testing.T) {
	// Its servers are on ports the kernel chose, and it judges no timing:
	// it waits on its clients more than it computes (some 20 CPU-seconds
	// besides the deskway link; it took 26 s alone).
	parallel(t)
	testkit.Require(t, "nbd-server", "nbdkit", "qemu-nbd")
	out := t.TempDir()
	res := runBench(t, out, "bootstorm", "--clients", "1,3", "--readers", "2", "--read-duration", "500ms",
		"--time-scale", "0", "--runs", "2", "--verify")
	if res.Bench != "stream" {
		t.Fatalf("bench %q", res.Bench)
	}
	for _, k := range []string{"max_clients_no_slow_requests", "slow_ratio_floor_max", "boot_ratio_floor_max", "slow_ratio_best_peer_max",
		"read_gbps", "read_ratio_best_peer", "rss_bytes_per_client", "rss_bytes_per_client_excl_cache",
		"slow_ratio_floor_max_worst_run", "boot_ratio_floor_max_worst_run", "slow_ratio_best_peer_max_worst_run", "read_gbps_worst_run"} {
		if _, ok := res.Summary[k]; !ok {
			t.Errorf("summary lacks %s", k)
		}
	}
	seen := map[string]bool{}
	for _, p := range res.Points {
		if p.Skipped != "" {
			t.Errorf("%s skipped: %s", p.System, p.Skipped)
			continue
		}
		seen[p.Scenario+"/"+p.System] = true
		if p.Metrics["failed_clients"] != 0 {
			t.Errorf("%s/%s: %v clients failed", p.Scenario, p.System, p.Metrics["failed_clients"])
		}
		if p.Metrics["bytes_read"] <= 0 {
			t.Errorf("%s/%s read nothing", p.Scenario, p.System)
		}
		// --verify: clients compared what they read outside the trace's
		// writes with the base image; a wrong byte fails the client.
		if p.Metrics["verified_bytes"] <= 0 {
			t.Errorf("%s/%s: no byte read was checked against the base", p.Scenario, p.System)
		}
		// Every system runs every step as often as deskway.
		if p.Params["runs"] != float64(2) {
			t.Errorf("%s/%s ran %v times, want 2", p.Scenario, p.System, p.Params["runs"])
		}
	}
	for _, sys := range []string{"deskway", "nbd-server-cow", "nbdkit-cow", "qemu-nbd", "floor"} {
		for _, sc := range []string{"storm", "read"} {
			if !seen[sc+"/"+sys] {
				t.Errorf("no %s point for %s", sc, sys)
			}
		}
	}
	for _, f := range []string{"result.md", "boot-time.svg", "slow-requests.svg", "read-throughput.svg"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}

// TestBootstormBenchDiscardSmoke runs the boot storm with clients that
// drop read data in the kernel: every client finishes and the bytes the
// servers sent are counted.
func TestBootstormBenchDiscardSmoke(t *testing.T) {
	parallel(t) // as TestBootstormBenchSmoke
	testkit.Require(t, "qemu-nbd")
	out := t.TempDir()
	res := runBench(t, out, "bootstorm", "--discard-reads", "--systems", "deskway,qemu-nbd", "--clients", "2",
		"--readers", "2", "--read-duration", "500ms", "--time-scale", "0", "--runs", "1")
	n := 0
	for _, p := range res.Points {
		if p.Skipped != "" || p.Metrics["clients"] == 0 && p.Metrics["bytes_read"] == 0 {
			continue
		}
		n++
		if p.Metrics["failed_clients"] != 0 || p.Metrics["bytes_read"] <= 0 {
			t.Errorf("%s/%s: %v clients failed, %v bytes read", p.Scenario, p.System, p.Metrics["failed_clients"], p.Metrics["bytes_read"])
		}
	}
	if n < 4 {
		t.Fatalf("%d storm and read points, want 4: %+v", n, res.Points)
	}
}

// runBench runs `deskway bench NAME ARGS --out out` and decodes its result.json.
func runBench(t *testing.T, out, name string, args ...string) report.Result {
	t.Helper()
	return runBenchIn(t, benchPlace{}, out, name, args...)
}

// benchPlace is where a bench runs, when not where the test does.
type benchPlace struct {
	// tmp holds the bench's temporary files (its databases among them).
	tmp string
	// ns is the xrdp setup's namespace: a bench that starts xrdp, whose
	// sessions only an agent in ns then reads.
	ns *testkit.XRDPNamespace
}

// runBenchIn is runBench with the bench run at. If the test fails after
// the bench ran, the bench's last lines are logged: its own log names
// what it measured and what went wrong.
func runBenchIn(t *testing.T, at benchPlace, out, name string, args ...string) report.Result {
	t.Helper()
	argv := append(append([]string{build(t), "bench", name}, args...), "--out", out)
	if at.ns != nil {
		argv = at.ns.Command(argv[0], argv[1:]...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	if at.tmp != "" {
		cmd.Env = append(os.Environ(), "TMPDIR="+at.tmp)
	}
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, lastLines(string(b), 40))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the bench's last lines:\n%s", lastLines(string(b), 30))
		}
	})
	return readResult(t, out)
}

// memoryDir is a temporary folder in memory (/dev/shm). A smoke test of
// a bench that runs a durable PostgreSQL keeps its database there: on
// disk, its commits' fsyncs wait behind whatever the rest of the run has
// written (the qemu guests' disks), and a stall of tens of seconds then
// turns a shape check into a timing one.
func memoryDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "deskway-e2e-")
	if err == nil {
		// Open to all as /tmp is: PostgreSQL runs as its own user.
		err = os.Chmod(d, 0o1777)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// readResult decodes the result.json a bench wrote into out.
func readResult(t *testing.T, out string) report.Result {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(out, "result.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res report.Result
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestBrokerBenchSmoke runs a tiny `deskway bench broker` (few hosts and
// launches, PostgreSQL behind 20 ms of injected round trip, and SQLite)
// and checks the result's shape and that every launch was placed.
func TestBrokerBenchSmoke(t *testing.T) {
	// Its brokers and PostgreSQL are on ports the kernel chose, and it
	// judges no timing but the injected round trip's floor: it waits on
	// them (a few CPU-seconds besides the deskway link; it took 19 s
	// alone).
	parallel(t)
	out := t.TempDir()
	res := runBenchIn(t, benchPlace{tmp: memoryDir(t)}, out, "broker", "--mode", "placement", "--hosts", "6", "--launches", "150", "--concurrency", "4,12", "--rtt", "20ms")
	if res.Bench != "broker" || res.Command == "" {
		t.Fatalf("header: %+v", res)
	}
	for _, k := range []string{"rtt10_c60_launches_per_s", "rtt250_c60_launches_per_s", "rtt250_c60_median_ms"} {
		if _, ok := res.Summary[k]; ok {
			t.Errorf("summary has %s for a point that was not measured", k)
		}
	}
	if v, ok := res.Summary["max_error_pct"]; !ok || v != 0 {
		t.Errorf("max_error_pct = %v (present %v), want 0", v, ok)
	}
	seen := map[string]int{}
	for _, p := range res.Points {
		if p.Skipped != "" {
			t.Errorf("%s skipped: %s", p.System, p.Skipped)
		}
		seen[p.System]++
		if p.System == "paper" {
			continue
		}
		m := p.Metrics
		if m["launches"] != 150 || m["errors"] != 0 || m["launches_per_s"] <= 0 || m["median_ms"] <= 0 {
			t.Errorf("point %v: %v", p.Params, m)
		}
		// Through the proxy every launch pays at least one 20 ms round trip.
		if p.System == "deskway-postgres" && m["median_ms"] < 20 {
			t.Errorf("postgres median %v ms under the injected 20 ms round trip", m["median_ms"])
		}
	}
	if seen["deskway-postgres"] != 2 || seen["deskway-sqlite"] != 2 || seen["paper"] != 25 {
		t.Errorf("points per system: %v", seen)
	}
	for _, f := range []string{"result.md", "launches-per-second.svg", "response-time.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing or empty", f)
		}
	}
}

// TestBrokerBenchEndToEnd runs a small `deskway bench broker --mode e2e`:
// sessions take a logon time to appear, users relaunch and log off, and
// the bench itself fails unless the database ends holding exactly the
// hosts' sessions. It checks the summary keys and that every relaunch
// came back to its session.
func TestBrokerBenchEndToEnd(t *testing.T) {
	// As TestBrokerBenchSmoke; its bottleneck is the hosts' 1 s logons,
	// which no neighbour's load shortens.
	parallel(t)
	out := t.TempDir()
	res := runBenchIn(t, benchPlace{tmp: memoryDir(t)}, out, "broker", "--mode", "e2e", "--hosts", "4", "--e2e-launches", "160", "--e2e-concurrency", "60",
		"--e2e-rtt", "10ms", "--logon-median", "1s", "--relaunch-share", "0.2", "--logoff-share", "0.1")
	for _, k := range []string{"e2e_rtt10_c60_launches_per_s", "e2e_median_ms"} {
		if res.Summary[k] <= 0 {
			t.Errorf("summary %s = %v", k, res.Summary[k])
		}
	}
	if b := res.SummaryText["e2e_bottleneck"]; b != "logon limit" {
		// 4 hosts × 5 logon slots ÷ 1 s logons allow about 17 launches/s;
		// 60 launches in flight 10 ms from the database allow 6,000.
		t.Errorf("e2e_bottleneck = %q, want logon limit", b)
	}
	if _, ok := res.Summary["rtt10_c60_launches_per_s"]; ok {
		t.Error("placement summary present though placement was not measured")
	}
	n := 0
	for _, p := range res.Points {
		if p.Scenario != "launch-storm-e2e" {
			t.Errorf("point of scenario %s in an e2e run", p.Scenario)
			continue
		}
		n++
		m := p.Metrics
		if m["launches"] != 160 || m["errors"] != 0 || m["relaunches"] < 5 || m["reconnects"] != m["relaunches"] || m["logoffs"] < 1 ||
			m["new_users"]+m["relaunches"] != 160 || m["busy_waits"]+m["retries"] == 0 {
			t.Errorf("point %v: %v", p.Params, m)
		}
		// Time to desktop includes the 1 s median logon.
		if m["desktop_median_s"] < 0.5 {
			t.Errorf("desktop_median_s = %v", m["desktop_median_s"])
		}
	}
	if n != 1 {
		t.Errorf("%d end-to-end points, want 1", n)
	}
	md, err := os.ReadFile(filepath.Join(out, "result.md"))
	if err != nil || !strings.Contains(string(md), "| Bottleneck | logon limit |") {
		t.Errorf("result.md lacks the end-to-end table: %v\n%s", err, md)
	}
}

// TestPortalBenchSmoke runs a small `deskway bench portal` and checks its
// shape: both systems in every run, every console page, the summary keys.
func TestPortalBenchSmoke(t *testing.T) {
	// Its servers run in the bench's process on ports the kernel chose,
	// and it checks the result's shape, none of its figures.
	parallel(t)
	out := t.TempDir()
	res := runBench(t, out, "portal", "--users", "30", "--sessions", "80", "--runs", "2", "--console-requests", "5", "--concurrency", "4")
	for _, k := range []string{"portal_launches_per_s", "api_launches_per_s", "portal_ratio_api", "console_p99_ms_10k_sessions"} {
		if res.Summary[k] <= 0 {
			t.Errorf("summary %s = %v", k, res.Summary[k])
		}
	}
	seen := map[string]int{}
	for _, p := range res.Points {
		seen[p.Scenario+"/"+p.System]++
		if p.Scenario == "console" && fmt.Sprint(p.Params["sessions"]) != "80" {
			t.Errorf("console timed with %v sessions, want the 80 asked for", p.Params["sessions"])
		}
	}
	if seen["launch/deskway-api"] != 2 || seen["launch/deskway-portal"] != 2 || seen["console/deskway"] != 5 {
		t.Errorf("points: %v", seen)
	}
}

// testBrowserBenchSmoke runs a short `deskway bench browser` (xrdp,
// chromium, xfreerdp, the gateway on its own) and checks the result's
// shape: every run of every client (the browser with each setting of
// gateway.browser_compression), first frames and frames counted, the
// summary keys docs/benchmarks/browser is read by, and that chromium,
// which negotiates permessage-deflate, is sent fewer bytes with
// compression on than off in every run while its frames keep coming.
// It runs in a namespace of xs, the machine's setup (MachineXRDP): the
// bench starts xrdp from /etc/xrdp, and not while a session manager
// listens on port 3350.
func testBrowserBenchSmoke(t *testing.T, xs testkit.XRDPSetup) {
	testkit.Require(t, "xrdp", "xfreerdp", "Xvfb", "chromium", "import")
	ns := testkit.NewXRDPNamespace(t, xs)
	out := t.TempDir()
	res := runBenchIn(t, benchPlace{ns: ns}, out, "browser", "--runs", "2", "--window", "2s")
	for _, k := range []string{"browser_first_frame_s", "xfreerdp_first_frame_s", "first_frame_ratio", "gateway_cpu_ratio_tsgu", "browser_fps", "xfreerdp_fps",
		"bytes_ratio_tsgu", "bytes_ratio_tsgu_worst", "gateway_cpu_ratio_tsgu_off", "bytes_ratio_tsgu_off", "bytes_ratio_tsgu_no_context_takeover"} {
		if v, ok := res.Summary[k]; !ok || v <= 0 {
			t.Errorf("summary %s = %v", k, v)
		}
	}
	seen := map[string]int{}
	toClient := map[string]map[any]float64{}
	for _, p := range res.Points {
		seen[p.System]++
		if p.Metrics["first_frame_s"] <= 0 || p.Metrics["fps"] <= 0 || p.Metrics["gateway_kbytes_per_s"] <= 0 || p.Metrics["to_client_kbytes_per_s"] <= 0 {
			t.Errorf("point %+v", p)
		}
		if toClient[p.System] == nil {
			toClient[p.System] = map[any]float64{}
		}
		toClient[p.System][p.Params["run"]] = p.Metrics["to_client_kbytes_per_s"]
	}
	for _, sys := range []string{"deskway-browser", "deskway-browser-no-context-takeover", "deskway-browser-uncompressed", "deskway-xfreerdp"} {
		if seen[sys] != 2 {
			t.Fatalf("points %v, want 2 runs of each client", seen)
		}
	}
	for run, off := range toClient["deskway-browser-uncompressed"] {
		if on := toClient["deskway-browser"][run]; on >= off {
			t.Errorf("run %v: %.0f KiB/s to chromium with context_takeover, %.0f with compression off", run, on, off)
		}
	}
	for _, f := range []string{"result.md", "first-frame.svg", "browser-moving.png", "browser-uncompressed-moving.png", "xfreerdp-moving.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}

// TestSessionhostBenchSmoke runs a short `deskway bench sessionhost`:
// three users log on through the gateway with xfreerdp and run the
// workload in their xrdp desktops, then the broker places two under a
// session limit of 2 and refuses the third. It checks that every action
// ran and passed its own check (the editor's sentence reached the file,
// the unpacked document matched), that typing took at least its keys'
// delay (a workload that skipped the editor would report less), the
// counters the report is read by, and what --suggest-limit printed.
func TestSessionhostBenchSmoke(t *testing.T) {
	testkit.Require(t, "xrdp", "xfreerdp", "Xvfb", "xterm", "xdotool", "vim.tiny")
	testkit.RequireRoot(t)
	// Its broker's agent reads every xrdp session on the machine.
	testkit.Lock(t, testkit.LockSesman, testkit.LockSesmanSecond)
	out := t.TempDir()
	// The broker ramp checks the stop at the session limit; the machine
	// runs other tests beside it, whose waiting is no business of the
	// host's, so no CPU pressure limit, and no waiting for the pressure
	// to settle between ramps (up to 40 s each on a busy machine).
	// --suggest-limit with --session-limit runs the broker ramp too: one
	// run, one rig (a second run for --suggest-limit alone started xrdp,
	// the users and the gateway again, some 40 s).
	cmd := exec.Command(build(t), "bench", "sessionhost", "--users", "3", "--ramps", "2", "--interval", "8s", "--think", "1s", "--session-limit", "2",
		"--cpu-pressure-max-pct", "100", "--calm-wait", "0", "--suggest-limit", "--out", out)
	printed, runErr := cmd.CombinedOutput()
	if _, err := os.Stat(filepath.Join(out, "result.json")); err != nil {
		t.Fatalf("bench: %v, no result: %v\n%s", runErr, err, lastLines(string(printed), 40))
	}
	res := readResult(t, out)
	actions := map[string]int{}
	steps := map[string]int{}
	for _, p := range res.Points {
		if p.System != "deskway" || p.Scenario == "capacity" {
			continue
		}
		steps[p.Scenario]++
		if p.Scenario == "degradation" {
			continue
		}
		if _, failed := p.Params["logon_failed"]; failed {
			continue
		}
		m := p.Metrics
		if m["failed_actions"] != 0 || m["actions"] == 0 || m["logon_s"] <= 0 || m["mem_bytes_per_session"] < 8<<20 || m["host_cpu_pct"] <= 0 || m["client_cpu_pct"] <= 0 {
			t.Errorf("%s step %v: %v", p.Scenario, p.Params["users"], m)
		}
		for k, v := range m {
			if a, ok := strings.CutSuffix(k, "_median_ms"); ok {
				actions[a]++
				// xdotool's --delay 15 spends 7.5 ms a key in all (it
				// types this sentence in 650–670 ms on an idle X server),
				// so an edit faster than that typed nothing.
				keys := len("GoThe quarterly figures for 12345 look fine; send them to the team by Friday.")
				if a == "edit" && v < float64(keys)*7.5 {
					t.Errorf("typing %d keys with xdotool's --delay 15 (at least 7.5 ms a key) took %v ms", keys, v)
				}
			}
		}
	}
	for _, a := range []string{"edit", "search", "compress", "files", "scroll"} {
		if actions[a] == 0 {
			t.Errorf("no step timed %s: %v", a, actions)
		}
	}
	if steps["ramp-gateway"] != 6 || steps["degradation"] != 2 || steps["ramp-broker"] != 3 || res.Summary["ramps"] != 2 {
		t.Errorf("steps %v, summary %v: want 3 in each of the two measuring ramps, a point for each, and 3 in the broker's (its third refused)", steps, res.Summary)
	}
	if res.Summary["broker_last_placement_users"] != 2 || res.Summary["broker_session_limit"] != 2 {
		t.Errorf("summary %v: the broker should place 2 users under a limit of 2", res.Summary)
	}
	for _, p := range res.Points {
		if p.Scenario == "ramp-broker" && fmt.Sprint(p.Params["users"]) == "3" {
			if why := fmt.Sprint(p.Params["logon_failed"]); !strings.Contains(why, "503") || !strings.Contains(why, "full") {
				t.Errorf("the third launch: %s", why)
			}
		}
	}
	if res.SummaryText["limiting_counter"] == "" || res.Summary["memory_bytes_per_session"] < 8<<20 {
		t.Errorf("summary %v %v", res.Summary, res.SummaryText)
	}
	for _, f := range []string{"result.md", "action-time.svg", "counters.svg", "memory.svg"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	// --suggest-limit: three users at a time do not slow this host by a
	// second, so no limit can be drawn, and the command says so and fails
	// rather than print one. Should a ramp have degraded on a busy
	// machine, it prints the limit one below the worst ramp's point,
	// which result.json names. (The printout itself is unit-tested.)
	var ee *exec.ExitError
	switch worst := int(res.Summary["degradation_users_worst"]); worst {
	case 0:
		if !errors.As(runErr, &ee) || !strings.Contains(string(printed), "served 3 users without degrading in every ramp: ramp further (--users)") || strings.Contains(string(printed), "session_limit:") {
			t.Errorf("--suggest-limit with no degradation: %v\n%s", runErr, lastLines(string(printed), 10))
		}
	case 1:
		if !errors.As(runErr, &ee) || !strings.Contains(string(printed), "the first user already passed the degradation threshold") || strings.Contains(string(printed), "session_limit:") {
			t.Errorf("--suggest-limit with the first user degraded: %v\n%s", runErr, lastLines(string(printed), 10))
		}
	default:
		if runErr != nil || !strings.Contains(string(printed), fmt.Sprintf("\nsession_limit: %d\n", worst-1)) {
			t.Errorf("--suggest-limit with the worst ramp degraded at %d users: %v\n%s", worst, runErr, lastLines(string(printed), 10))
		}
	}
}
