package site

import (
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/config"
)

// TestLearnSink: a BGP route goes to the GRE site whose configured
// prefixes hold its next hop, moves with its next hop (even to a site
// listed before the one it leaves), is not installed when its next hop
// is behind no site, and goes when withdrawn.
func TestLearnSink(t *testing.T) {
	ns := testNamespace(t, "dwsk")
	tn, err := newTenant(&config.Tenant{Name: "a", Key: 7, Namespace: ns, Interface: "dw-a", MTU: 1400, Prefixes: []string{"10.0.0.0/24"},
		Sites: []config.TenantSite{
			{Name: "branch", Peer: "198.51.100.3", Prefixes: []string{"192.168.2.1/32"}},
			{Name: "office", Peer: "198.51.100.2", Prefixes: []string{"192.168.1.1/32"}},
		}}, newMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tn.up(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = tn.down() })
	sink := &learnSink{t: tn, log: slog.New(slog.DiscardHandler), routes: map[netip.Prefix]netip.Addr{}}
	at := func(addr string) string {
		st, ok := tn.routes.Load().Lookup(netip.MustParseAddr(addr))
		if !ok {
			return ""
		}
		return st.name
	}
	routed := func(p string) bool {
		out, err := exec.Command("ip", "-n", ns, "route", "show", p).CombinedOutput()
		if err != nil {
			t.Fatalf("ip route: %v\n%s", err, out)
		}
		return strings.Contains(string(out), "dev dw-a")
	}
	sink.Add(netip.MustParsePrefix("192.168.50.0/24"), netip.MustParseAddr("192.168.1.1"))
	sink.Add(netip.MustParsePrefix("192.168.60.0/24"), netip.MustParseAddr("192.168.2.1"))
	sink.Add(netip.MustParsePrefix("192.168.70.0/24"), netip.MustParseAddr("10.9.9.9"))
	if at("192.168.50.5") != "office" || at("192.168.60.5") != "branch" || at("192.168.70.5") != "" {
		t.Fatalf("50 → %q, 60 → %q, 70 → %q; want office, branch and none", at("192.168.50.5"), at("192.168.60.5"), at("192.168.70.5"))
	}
	if !routed("192.168.50.0/24") || !routed("192.168.60.0/24") || routed("192.168.70.0/24") {
		t.Fatal("the kernel routes do not follow the learnt ones")
	}
	// The next hop moves to branch, which is listed before office.
	sink.Add(netip.MustParsePrefix("192.168.50.0/24"), netip.MustParseAddr("192.168.2.1"))
	if at("192.168.50.5") != "branch" {
		t.Fatalf("192.168.50.0/24 with its next hop behind branch goes to %q", at("192.168.50.5"))
	}
	sink.Remove(netip.MustParsePrefix("192.168.60.0/24"))
	if at("192.168.60.5") != "" || routed("192.168.60.0/24") {
		t.Fatal("192.168.60.0/24 still routed after its withdrawal")
	}
}
