package bgp

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/deskway/deskway/internal/testkit"
)

// Addresses on the veth between the tenant's namespace (the gateway's
// side, .1) and the router's (.2; .3 is an address no peer is configured
// for).
const (
	gw4, rt4, stranger4 = "192.0.2.1", "192.0.2.2", "192.0.2.3"
	gw6, rt6            = "2001:db8:ff::1", "2001:db8:ff::2"
)

// frrConf is the tenant's router: one IPv4 session carrying IPv4 unicast
// and one IPv6 session (with a TCP MD5 key) carrying IPv6 unicast, each
// announcing one prefix inside the tenant's accepted space and one
// outside it (a hijack). Its hold time (30s) is longer than the
// gateway's, so the 3s the test sees is the gateway's setting.
const frrConf = `frr defaults traditional
hostname tenant-router
log stdout informational
router bgp 65001
 bgp router-id 192.0.2.2
 no bgp ebgp-requires-policy
 no bgp network import-check
 neighbor 192.0.2.1 remote-as 65000
 neighbor 192.0.2.1 timers 10 30
 neighbor 192.0.2.1 timers connect 1
 neighbor 2001:db8:ff::1 remote-as 65000
 neighbor 2001:db8:ff::1 timers 10 30
 neighbor 2001:db8:ff::1 timers connect 1
 neighbor 2001:db8:ff::1 password md5-Secret-9
 address-family ipv4 unicast
  network 192.168.1.0/24
  network 10.99.0.0/24
  no neighbor 2001:db8:ff::1 activate
 exit-address-family
 address-family ipv6 unicast
  network 2001:db8:1::/48
  network 2001:db9:66::/48
  neighbor 2001:db8:ff::1 activate
 exit-address-family
`

// TestSpeakerFRR runs a Speaker in a tenant's namespace against FRR's
// bgpd in the router's namespace, joined by a veth: the allowed prefixes
// arrive, the hijacks do not, the gateway's prefixes reach FRR's table, a
// withdrawal and a prefix flood are honoured, a stranger's session is
// refused, and a router that dies silently costs its routes after the
// hold time.
func TestSpeakerFRR(t *testing.T) {
	requireRoot(t)
	tenantNS, routerNS := newNetns(t, "dwbgp-t"), newNetns(t, "dwbgp-r")
	ipOK(t, "-n", tenantNS, "link", "add", "vt", "type", "veth", "peer", "name", "vr", "netns", routerNS)
	ipOK(t, "-n", tenantNS, "addr", "add", gw4+"/24", "dev", "vt")
	ipOK(t, "-n", tenantNS, "addr", "add", gw6+"/64", "dev", "vt", "nodad")
	ipOK(t, "-n", routerNS, "addr", "add", rt4+"/24", "dev", "vr")
	ipOK(t, "-n", routerNS, "addr", "add", stranger4+"/24", "dev", "vr")
	ipOK(t, "-n", routerNS, "addr", "add", rt6+"/64", "dev", "vr", "nodad")
	for _, ns := range []string{tenantNS, routerNS} {
		ipOK(t, "-n", ns, "link", "set", "lo", "up")
	}
	ipOK(t, "-n", tenantNS, "link", "set", "vt", "up")
	ipOK(t, "-n", routerNS, "link", "set", "vr", "up")

	cfg := Config{
		ASN:      65000,
		RouterID: gw4,
		Listen:   []string{gw4, gw6},
		Peers: []Peer{
			{Address: rt4, ASN: 65001, HoldTime: 3 * time.Second, MaxPrefixes: 3},
			{Address: rt6, ASN: 65001, HoldTime: 3 * time.Second, Password: "md5-Secret-9"},
		},
		Announce: []string{"10.0.0.0/24", "2001:db8:aaaa::/48"},
		Accept:   []string{"192.168.0.0/16", "2001:db8:1::/48"},
	}
	routes := newSink()
	reg := prometheus.NewRegistry()
	sp, err := New(cfg, Options{
		Tenant:   "acme",
		Netns:    "/run/netns/" + tenantNS,
		Sink:     routes,
		Logger:   speakerLog(t),
		Registry: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Stop)

	frr := testkit.StartFRR(t, routerNS, frrConf)

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
		return frrAdvertised(t, frr, rt4) >= 2
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

// dialFrom connects from laddr inside namespace ns: the socket is made on
// a thread moved into ns (and never moved back; it ends with its goroutine).
func dialFrom(t *testing.T, ns, laddr, raddr string) net.Conn {
	t.Helper()
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := enterNetns("/run/netns/" + ns); err != nil {
			ch <- result{err: err}
			return
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(laddr)}, Timeout: 10 * time.Second}
		c, err := d.Dial("tcp", raddr)
		ch <- result{c, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("dial %s from %s in %s: %v", raddr, laddr, ns, r.err)
	}
	return r.c
}

// waitFRR waits until FRR's table (a vtysh ... json command) holds prefix
// with nextHop.
func waitFRR(t *testing.T, frr *testkit.FRR, command, prefix, nextHop string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var out string
	for time.Now().Before(deadline) {
		out = frr.Vtysh(t, command)
		var table struct {
			Routes map[string][]struct {
				Nexthops []struct {
					IP string `json:"ip"`
				} `json:"nexthops"`
			} `json:"routes"`
		}
		if err := json.Unmarshal([]byte(out), &table); err != nil {
			t.Fatalf("%s: %v\n%s", command, err, out)
		}
		for _, path := range table.Routes[prefix] {
			for _, nh := range path.Nexthops {
				if nh.IP == nextHop {
					return
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("FRR's %q never held %s via %s:\n%s", command, prefix, nextHop, out)
}

// frrAdvertised is how many prefixes FRR says it sent the gateway.
func frrAdvertised(t *testing.T, frr *testkit.FRR, neighbor string) int {
	out := frr.Vtysh(t, "show ip bgp neighbors "+gw4+" advertised-routes json")
	var adv struct {
		Total int `json:"totalPrefixCounter"`
	}
	if err := json.Unmarshal([]byte(out), &adv); err != nil {
		t.Fatalf("advertised-routes: %v\n%s", err, out)
	}
	return adv.Total
}

// sink records the routes the speaker hands out.
type sink struct {
	mu      sync.Mutex
	routes  map[netip.Prefix]netip.Addr
	max4    int
	changed chan struct{}
}

func newSink() *sink {
	return &sink{routes: map[netip.Prefix]netip.Addr{}, changed: make(chan struct{}, 1)}
}

func (s *sink) Add(p netip.Prefix, nh netip.Addr) {
	s.mu.Lock()
	s.routes[p] = nh
	n := 0
	for q := range s.routes {
		if q.Addr().Is4() {
			n++
		}
	}
	s.max4 = max(s.max4, n)
	s.mu.Unlock()
	s.poke()
}

func (s *sink) Remove(p netip.Prefix) {
	s.mu.Lock()
	delete(s.routes, p)
	s.mu.Unlock()
	s.poke()
}

func (s *sink) poke() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *sink) get(p netip.Prefix) (netip.Addr, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	nh, ok := s.routes[p]
	return nh, ok
}

func (s *sink) peak4() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max4
}

// waitFor waits until cond holds for the routes, re-checking on each
// change and at least every 200ms (conditions may look beyond the sink).
func (s *sink) waitFor(t *testing.T, what string, timeout time.Duration, cond func(map[netip.Prefix]netip.Addr) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		snapshot := make(map[netip.Prefix]netip.Addr, len(s.routes))
		for p, nh := range s.routes {
			snapshot[p] = nh
		}
		s.mu.Unlock()
		if cond(snapshot) {
			return
		}
		select {
		case <-s.changed:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("waited %s for %s; routes: %v", timeout, what, snapshot)
		}
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("this test makes network namespaces and must run as root")
	}
	t.Skip("needs root to make network namespaces")
}

// newNetns makes a namespace with a random suffix, deleted at test end.
func newNetns(t *testing.T, prefix string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := prefix + "-" + hex.EncodeToString(b[:])
	ipOK(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

func ipOK(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// speakerLog keeps the speaker's and GoBGP's log lines and shows them if
// the test fails (GoBGP's goroutines may still write after the test's end,
// where t.Log would panic).
func speakerLog(t *testing.T) *slog.Logger {
	buf := &testkit.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			out := buf.String()
			if len(out) > 20000 {
				out = "…" + out[len(out)-20000:]
			}
			t.Logf("--- speaker log:\n%s", out)
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
