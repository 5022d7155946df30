package bgp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// lab is a tenant's namespace with a started Speaker and a router's
// namespace running FRR, joined by a veth.
type lab struct {
	tenantNS, routerNS string
	sp                 *Speaker
	routes             *sink
	reg                *prometheus.Registry
	frr                *testkit.FRR
}

// newLab builds the namespaces, starts the Speaker with ctx and starts FRR.
func newLab(t *testing.T, ctx context.Context) *lab {
	t.Helper()
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
	if err := sp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Stop)

	frr := testkit.StartFRR(t, routerNS, frrConf)
	return &lab{tenantNS: tenantNS, routerNS: routerNS, sp: sp, routes: routes, reg: reg, frr: frr}
}

// dialFrom connects from laddr inside namespace ns, or fails the test.
func dialFrom(t *testing.T, ns, laddr, raddr string) net.Conn {
	t.Helper()
	c, err := dialIn(ns, laddr, raddr)
	if err != nil {
		t.Fatalf("dial %s from %s in %s: %v", raddr, laddr, ns, err)
	}
	return c
}

// dialIn connects from laddr inside namespace ns: the socket is made on a
// thread moved into ns (and never moved back; it ends with its goroutine).
func dialIn(ns, laddr, raddr string) (net.Conn, error) {
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
	return r.c, r.err
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
	out := frr.Vtysh(t, "show ip bgp neighbors "+neighbor+" advertised-routes json")
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

func (s *sink) snapshot() map[netip.Prefix]netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[netip.Prefix]netip.Addr, len(s.routes))
	for p, nh := range s.routes {
		out[p] = nh
	}
	return out
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
		snapshot := s.snapshot()
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
