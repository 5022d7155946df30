package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/testkit"
)

// testTTFFBenchSmoke runs `deskway bench ttff` once for each system
// (xrdp, HAProxy in TCP mode, the gateway on both transports with both
// authentications, xfreerdp under strace) and checks the result's
// shape: a first frame for every system, each deskway connection's
// tunnel opened by the gateway (its open_ms read from its log), the
// legacy transport's two connections to the gateway and the others'
// one, and the summary keys docs/benchmarks/gateway/ttff is read by.
// It runs in a namespace of xs, the machine's setup (MachineXRDP): the
// bench starts xrdp from /etc/xrdp, and not while a session manager
// listens on port 3350.
func testTTFFBenchSmoke(t *testing.T, xs testkit.XRDPSetup) {
	testkit.Require(t, "xrdp", "xfreerdp", "Xvfb", "xterm", "strace", "haproxy")
	ns := testkit.NewXRDPNamespace(t, xs)
	out := t.TempDir()
	res := runBenchIn(t, benchPlace{ns: ns}, out, "ttff", "--runs", "1")
	if res.Bench != "ttff" || res.Command == "" {
		t.Fatalf("header: %+v", res)
	}
	seen := map[string]int{}
	for _, p := range res.Points {
		seen[p.System]++
		m := p.Metrics
		if m["first_frame_s"] <= 0 {
			t.Errorf("point %+v", p)
		}
		if strings.HasPrefix(p.System, "deskway-") && (m["tunnel_open_s"] <= 0 || m["gateway_served_s"] <= 0 || m["gateway_http_s"] <= 0) {
			t.Errorf("%s: no tunnel open or working times from the gateway's log: %+v", p.System, m)
		}
		want := 1.0
		if strings.HasPrefix(p.System, "deskway-legacy") {
			want = 2 // RDG_IN_DATA and RDG_OUT_DATA
		}
		if m["tcp_connects"] != want {
			t.Errorf("%s: %v TCP connections to the first hop, want %v", p.System, m["tcp_connects"], want)
		}
	}
	for _, sys := range []string{"direct", "haproxy-tcp", "deskway-websocket-paa", "deskway-websocket-ntlm", "deskway-legacy-paa", "deskway-legacy-ntlm"} {
		if seen[sys] != 1 {
			t.Fatalf("points %v, want one connection of each system", seen)
		}
	}
	for _, k := range []string{"ttff_added_s", "ttff_added_s_worst", "relay_added_s", "direct_first_frame_s", "haproxy_tcp_first_frame_s_worst",
		"deskway_legacy_ntlm_first_frame_s", "direct_waits_100ms", "deskway_websocket_paa_waits_100ms_worst", "tunnel_open_s_websocket_paa", "ttff_added_s_legacy_paa_worst",
		"ttff_added_less_waits_s", "gateway_work_s_legacy_ntlm"} {
		if _, ok := res.Summary[k]; !ok {
			t.Errorf("summary has no %s", k)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "result.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "100 ms waits per connection") || !strings.Contains(string(md), "Load average") {
		t.Errorf("result.md lacks the waits or the load average:\n%s", md)
	}
}
