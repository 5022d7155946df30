package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// metric reads one series of the gateway's /metrics (its admin listener
// is on the gateway namespace's loopback); absent is -1.
func (r *siteRig) metric(series string) float64 {
	r.t.Helper()
	out, err := r.exec(r.gw, "curl", "-sk", "https://127.0.0.1:9443/metrics")
	if err != nil {
		r.t.Fatalf("GET /metrics: %v\n%s", err, out)
	}
	for line := range strings.Lines(out) {
		if name, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && name == series {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// TestSiteWire: what the gateway sends, decoded by tshark (Wireshark's
// GRE dissector): each tenant's key, on its own underlay family, with
// sequence numbers and a checksum that verifies where tenant b asks for
// them; and deskway site tunnels and /metrics count what went through
// (tenant a on the kernel datapath, b, with sequence numbers, on the
// userspace one).
func TestSiteWire(t *testing.T) {
	parallel(t)
	testkit.Require(t, "tshark")
	r := newSiteRig(t)
	pcap := filepath.Join(t.TempDir(), "underlay.pcap")
	cap := testkit.Start(t, nil, "ip", "netns", "exec", r.gw, "tshark", "-i", "ul0", "-f", "ip proto 47 or ip6 proto 47", "-c", "16", "-w", pcap)
	waitLog(t, cap, "Capture started")
	done := make(chan error, 1)
	go func() { done <- cap.Cmd.Wait() }()
	// tshark may start capturing a little after it says so: each office
	// pings once a round until it has seen 16 frames (4 rounds, if it
	// missed none).
	pings := map[string]string{"a": "10.0.0.10", "b": "fd00:10::10"}
	from := map[string]string{"a": "192.168.1.10", "b": "fd00:192::10"}
	rounds := 0
	for captured := false; !captured; {
		for _, x := range []string{"a", "b"} {
			if out, err := r.exec(r.officeLAN[x], "busybox", "ping", "-c", "1", "-W", "3", "-I", from[x], pings[x]); err != nil {
				t.Fatalf("office %s pings %s: %v\n%s", x, pings[x], err, out)
			}
		}
		rounds++
		select {
		case <-done:
			captured = true
		case <-time.After(100 * time.Millisecond):
			if rounds == 20 {
				t.Fatalf("tshark saw fewer than 16 GRE frames in 20 rounds of pings:\n%s", cap.Log.String())
			}
		}
	}
	out, err := exec.Command("tshark", "-r", pcap, "-T", "fields", "-E", "separator=|",
		"-e", "ip.src", "-e", "ipv6.src", "-e", "ipv6.dst", "-e", "gre.key", "-e", "gre.sequence_number", "-e", "gre.checksum.status").Output()
	if err != nil {
		t.Fatalf("tshark -r: %v\n%s", err, out)
	}
	seen := map[string]int{}
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		f := strings.Split(strings.TrimSpace(line), "|")
		// Outer addresses first, then the inner ones, comma-separated.
		addrs := strings.Split(f[0]+f[1], ",")
		seen[fmt.Sprintf("key=%s outer=%s inner=%s seq=%v checksum=%s", f[3], addrs[0], strings.Join(addrs[1:], ","), f[4] != "", f[5])]++
	}
	want := []string{
		// Tenant a over IPv4: key 1001 (0x3e9), no sequence, no checksum.
		"key=0x000003e9 outer=198.51.100.1 inner=10.0.0.10 seq=false checksum=",
		"key=0x000003e9 outer=198.51.100.2 inner=192.168.1.10 seq=false checksum=",
		// Tenant b over IPv6: key 1002 (0x3ea), sequence numbers, and
		// checksums tshark verifies (status 1 is good, 0 bad) from the
		// gateway; its office router sends sequence numbers only.
		"key=0x000003ea outer=2001:db8:100::1 inner=fd00:10::10 seq=true checksum=1",
		"key=0x000003ea outer=2001:db8:100::3 inner=fd00:192::10 seq=true checksum=",
	}
	if len(seen) != len(want) || slices.ContainsFunc(want, func(w string) bool { return seen[w] == 0 }) {
		t.Fatalf("tshark decoded %v\nwant each of:\n%s\nraw:\n%s", seen, strings.Join(want, "\n"), out)
	}

	// The operator's view, as docs/site.md shows it: every tunnel up,
	// with what crossed it.
	cli, err := r.exec(r.gw, r.docCommand("site-tunnels")...)
	if err != nil {
		t.Fatalf("deskway site tunnels: %v\n%s", err, cli)
	}
	for _, re := range []string{fmt.Sprintf(`(?m)^a\s+1001\s+office-a\s+198\.51\.100\.2\s+up\s+%[1]d\s+%[2]d\s+%[1]d\s+%[2]d\s+kernel$`, rounds, 84*rounds),
		fmt.Sprintf(`(?m)^b\s+1002\s+office-b\s+2001:db8:100::3\s+up\s+%[1]d\s+%[2]d\s+%[1]d\s+%[2]d\s+userspace$`, rounds, 104*rounds)} {
		if !regexp.MustCompile(re).MatchString(cli) {
			t.Fatalf("deskway site tunnels has no line matching %s:\n%s", re, cli)
		}
	}
	for series, want := range map[string]float64{
		`deskway_site_packets_total{direction="in",tenant="a"}`:  float64(rounds),
		`deskway_site_packets_total{direction="out",tenant="a"}`: float64(rounds),
		`deskway_site_bytes_total{direction="in",tenant="b"}`:    float64(104 * rounds),
		`deskway_site_drops_total{cause="spoofed",tenant="a"}`:   0,
	} {
		if got := r.metric(series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}
