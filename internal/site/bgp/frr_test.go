package bgp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSpeakerFRR runs a Speaker in a tenant's namespace against FRR's
// bgpd in the router's namespace, joined by a veth: the allowed prefixes
// arrive, the hijacks do not, the gateway's prefixes reach FRR's table, a
// withdrawal and a prefix flood are honoured, a stranger's session is
// refused, and a router that dies silently costs its routes after the
// hold time.
func TestSpeakerFRR(t *testing.T) {
	l := newLab(t, t.Context())
	sp, routes, reg, frr, routerNS := l.sp, l.routes, l.reg, l.frr, l.routerNS

	// The listeners are the tenant namespace's own sockets.
	out, err := exec.Command("ip", "netns", "exec", l.tenantNS, "ss", "-Hltn", "sport = :179").CombinedOutput()
	if err != nil {
		t.Fatalf("ss in %s: %v\n%s", l.tenantNS, err, out)
	}
	for _, want := range []string{gw4 + ":179", "[" + gw6 + "]:179"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no listener on %s in the tenant's namespace:\n%s", want, out)
		}
	}

	// FRR's prefixes inside the accepted space arrive with FRR's session
	// address as next hop; the hijacks never do.
	routes.waitFor(t, "FRR's allowed prefixes", 60*time.Second, func(r map[netip.Prefix]netip.Addr) bool {
		return r[netip.MustParsePrefix("192.168.1.0/24")] == netip.MustParseAddr(rt4) &&
			r[netip.MustParsePrefix("2001:db8:1::/48")] == netip.MustParseAddr(rt6)
	})
	if got := testutil.ToFloat64(sp.m.peerUp.WithLabelValues(rt4)); got != 1 {
		t.Errorf("peer_established{peer=%s} = %v, want 1", rt4, got)
	}

	// The gateway's announcements are in FRR's tables, next hop the
	// gateway's session address.
	waitFRR(t, frr, "show ip bgp json", "10.0.0.0/24", gw4)
	waitFRR(t, frr, "show bgp ipv6 unicast json", "2001:db8:aaaa::/48", gw6)
	// By now FRR has sent its whole table (its routes and ours crossed):
	// the hijacks were offered and refused, not merely not yet sent.
	routes.waitFor(t, "FRR's end of table", 10*time.Second, func(map[netip.Prefix]netip.Addr) bool {
		return frrAdvertised(t, frr, gw4) >= 2
	})
	for _, hijack := range []string{"10.99.0.0/24", "2001:db9:66::/48"} {
		if nh, ok := routes.get(netip.MustParsePrefix(hijack)); ok {
			t.Errorf("%s (outside the tenant's accepted space) reached the routing table via %s", hijack, nh)
		}
	}
	if got := testutil.ToFloat64(sp.m.announced); got != 2 {
		t.Errorf("prefixes_announced = %v, want 2", got)
	}
	if got := testutil.ToFloat64(sp.m.received); got != 2 {
		t.Errorf("prefixes_received = %v, want 2", got)
	}

	// A withdrawal removes the route.
	frr.Vtysh(t, "configure terminal", "router bgp 65001", "address-family ipv4 unicast", "no network 192.168.1.0/24")
	routes.waitFor(t, "192.168.1.0/24 withdrawn", 30*time.Second, func(r map[netip.Prefix]netip.Addr) bool {
		_, ok := r[netip.MustParsePrefix("192.168.1.0/24")]
		return !ok
	})

	t.Run("stranger refused", func(t *testing.T) { strangerRefused(t, routerNS) })

	// A router that floods past its limit (3) loses its session before
	// any prefix beyond the limit reaches the table.
	frr.Vtysh(t, "configure terminal", "router bgp 65001", "address-family ipv4 unicast",
		"network 192.168.2.0/24", "network 192.168.3.0/24", "network 192.168.4.0/24", "network 192.168.5.0/24")
	routes.waitFor(t, "the IPv4 session torn down by the prefix limit", 30*time.Second, func(map[netip.Prefix]netip.Addr) bool {
		return testutil.ToFloat64(sp.m.peerUp.WithLabelValues(rt4)) == 0
	})
	if peak := routes.peak4(); peak > 3 {
		t.Errorf("the IPv4 peer got %d prefixes into the table; its limit is 3", peak)
	}
	routes.waitFor(t, "the flooding router's routes removed", 30*time.Second, func(r map[netip.Prefix]netip.Addr) bool {
		for p := range r {
			if p.Addr().Is4() {
				return false
			}
		}
		return true
	})

	// The router dies without a word: its link goes first, so not even
	// the kernel's FIN or RST reaches the gateway. Only the hold time
	// (3s) can tell, and it must.
	if _, ok := routes.get(netip.MustParsePrefix("2001:db8:1::/48")); !ok {
		t.Fatal("the IPv6 route is gone before the router died")
	}
	ipOK(t, "-n", routerNS, "link", "set", "vr", "down")
	frr.Kill()
	died := time.Now()
	routes.waitFor(t, "the dead router's routes removed", 30*time.Second, func(r map[netip.Prefix]netip.Addr) bool {
		return len(r) == 0
	})
	took := time.Since(died)
	t.Logf("the dead router's routes were removed %s after it died", took.Round(time.Millisecond))
	if took < 2*time.Second || took > 15*time.Second {
		t.Errorf("routes removed %s after the router died; the hold time is 3s", took.Round(time.Millisecond))
	}

	// Stop closes everything and empties what the speaker handed out.
	sp.Stop()
	if n := testutil.CollectAndCount(reg); n != 0 {
		t.Errorf("%d metrics still registered after Stop", n)
	}
}

// strangerRefused opens a BGP session from an address of the router's
// namespace that no peer is configured for: the gateway must close it
// without a word (an OPEN back would mean it accepted a stranger).
func strangerRefused(t *testing.T, routerNS string) {
	conn := dialFrom(t, routerNS, stranger4, net.JoinHostPort(gw4, "179"))
	defer conn.Close()
	open, err := bgp.NewBGPOpenMessage(65001, 9, netip.MustParseAddr(stranger4), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := open.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(b); err != nil {
		return // already closed: refused
	}
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(conn)
	if len(got) > 0 {
		t.Fatalf("a stranger at %s got %d bytes of BGP back (want the connection closed): %x", stranger4, len(got), got)
	}
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a stranger's connection was neither closed nor reset: %v", err)
	}
}

// TestSpeakerStop ends the speaker through its context: it tells the
// router goodbye (a Cease NOTIFICATION, not a silent drop the router
// would notice only after the hold time), closes its listener, and takes
// back every route it handed out.
func TestSpeakerStop(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	l := newLab(t, ctx)
	l.routes.waitFor(t, "FRR's allowed prefixes", 60*time.Second, func(r map[netip.Prefix]netip.Addr) bool { return len(r) == 2 })
	waitFRR(t, l.frr, "show ip bgp json", "10.0.0.0/24", gw4)

	cancel()
	l.routes.waitFor(t, "the routes taken back once the context ended", 20*time.Second, func(r map[netip.Prefix]netip.Addr) bool { return len(r) == 0 })
	l.sp.Stop() // joins the stop the context began
	if c, err := dialIn(l.routerNS, rt4, net.JoinHostPort(gw4, "179")); err == nil {
		c.Close()
		t.Error("the gateway still accepts BGP connections after Stop")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := l.frr.Vtysh(t, "show bgp neighbors "+gw4+" json")
		var nbr map[string]struct {
			ResetDueTo string `json:"lastResetDueTo"`
			Reason     string `json:"lastNotificationReason"`
		}
		if err := json.Unmarshal([]byte(out), &nbr); err != nil {
			t.Fatalf("show bgp neighbors: %v\n%s", err, out)
		}
		if n := nbr[gw4]; n.ResetDueTo == "BGP Notification received" && strings.HasPrefix(n.Reason, "Cease/") {
			t.Logf("FRR: %s (%s)", n.ResetDueTo, n.Reason)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("FRR never heard the gateway's Cease notification:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
