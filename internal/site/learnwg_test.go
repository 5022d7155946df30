package site

import (
	"context"
	"log/slog"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/site/wg"
	"github.com/deskway/deskway/internal/testkit"
)

// TestLearnSinkWireGuard: a BGP route whose next hop is behind a
// WireGuard site joins that site's allowed IPs in the device and is
// routed through its interface; one overlapping the tenant's hosted
// network is refused; a GRE site's still goes to the GRE device; a
// withdrawal takes the route and the allowed IP back.
func TestLearnSinkWireGuard(t *testing.T) {
	testkit.Require(t, "wg")
	ns, ul := testNamespace(t, "dwsw"), testNamespace(t, "dwsv")
	if out, err := exec.Command("ip", "netns", "add", ul).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	tn, err := newTenant(&config.Tenant{Name: "a", Key: 7, Namespace: ns, Interface: "dw-a", MTU: 1400, Prefixes: []string{"10.0.0.0/24"},
		Sites: []config.TenantSite{{Name: "office", Peer: "198.51.100.2", Prefixes: []string{"192.168.1.1/32"}}}}, newMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tn.up(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = tn.down() })
	dir := t.TempDir()
	keyPath, _ := testkit.WireGuardKey(t, dir, "gateway")
	_, officePub := testkit.WireGuardKey(t, dir, "office")
	pub, err := wg.ParsePublicKey(officePub)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("cat", keyPath).Output()
	if err != nil {
		t.Fatal(err)
	}
	key, err := wg.ParsePrivateKey(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := wg.New(wg.Config{ListenPort: 51999, PrivateKey: "file:" + keyPath,
		Sites: []wg.Site{{Name: "paris", PublicKey: pub, Prefixes: []netip.Prefix{netip.MustParsePrefix("192.168.9.1/32")}}}},
		key, wg.Options{Tenant: "a", Namespace: "/run/netns/" + ns})
	if err != nil {
		t.Fatal(err)
	}
	// The UDP port opens in the namespace of the thread that starts the
	// device: the test's underlay, not the machine's.
	ulns, err := netns.GetFromName(ul)
	if err != nil {
		t.Fatal(err)
	}
	defer ulns.Close()
	if err := inNamespace(ulns, func() error { return dev.Start(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	tn.extras.wg = dev
	sink := &learnSink{t: tn, log: slog.New(slog.DiscardHandler), routes: map[netip.Prefix]netip.Addr{}}
	tn.extras.sink = sink
	routedVia := func(p string) string {
		out, err := exec.Command("ip", "-n", ns, "route", "show", p).CombinedOutput()
		if err != nil {
			t.Fatalf("ip route: %v\n%s", err, out)
		}
		for _, dev := range []string{"wg0", "dw-a"} {
			if strings.Contains(string(out), "dev "+dev) {
				return dev
			}
		}
		return ""
	}
	allowed := func() []netip.Prefix {
		states, err := dev.Sites()
		if err != nil || len(states) != 1 {
			t.Fatalf("the device's sites: %v %v", states, err)
		}
		return states[0].AllowedIPs
	}
	learnt := netip.MustParsePrefix("192.168.50.0/24")
	sink.Add(learnt, netip.MustParseAddr("192.168.9.1"))
	sink.Add(netip.MustParsePrefix("192.168.60.0/24"), netip.MustParseAddr("192.168.1.1"))
	sink.Add(netip.MustParsePrefix("10.0.0.128/25"), netip.MustParseAddr("192.168.9.1"))
	if via := routedVia("192.168.50.0/24"); via != "wg0" {
		t.Fatalf("192.168.50.0/24, learnt behind WireGuard site paris, is routed via %q", via)
	}
	if !slices.Contains(allowed(), learnt) {
		t.Fatalf("192.168.50.0/24 is not among paris's allowed IPs: %v", allowed())
	}
	if via := routedVia("192.168.60.0/24"); via != "dw-a" {
		t.Fatalf("192.168.60.0/24, learnt behind GRE site office, is routed via %q", via)
	}
	if via := routedVia("10.0.0.128/25"); via != "" || slices.Contains(allowed(), netip.MustParsePrefix("10.0.0.128/25")) {
		t.Fatalf("10.0.0.128/25, inside the hosted network, was installed (route via %q, allowed IPs %v)", via, allowed())
	}
	sink.Remove(learnt)
	if via := routedVia("192.168.50.0/24"); via != "" || slices.Contains(allowed(), learnt) {
		t.Fatalf("192.168.50.0/24 after its withdrawal: route via %q, allowed IPs %v", via, allowed())
	}
}
