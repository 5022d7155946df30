package wg

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// echoOnce serves one TCP connection on ln by echoing it back.
func echoOnce(t *testing.T, ln net.Listener) {
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		_, _ = io.Copy(c, c)
	}()
}

// tcpEcho sends 1 MiB from ns through a TCP connection to addr, where
// an echo listens, and checks every byte came back: data crosses the
// tunnel both ways, in segments far larger than one packet.
func tcpEcho(t *testing.T, ns, serverNS, addr string) {
	t.Helper()
	echoOnce(t, listenTCP(t, serverNS, addr))
	c, err := dialTCP(ns, addr)
	if err != nil {
		t.Fatalf("TCP from %s to %s: %v", ns, addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	back, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("TCP %s: read back: %v", addr, err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("TCP %s: write: %v", addr, err)
	}
	if sha256.Sum256(back) != sha256.Sum256(data) {
		t.Fatalf("TCP %s: %d bytes came back, not the 1 MiB sent", addr, len(back))
	}
}

// metricValue finds one sample in a /metrics text.
func metricValue(t *testing.T, text, name, labels string) (float64, bool) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name+"{"+labels+"}") + ` (\S+)$`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v, true
}

func TestWireGuardSiteReachesDesktop(t *testing.T) {
	needRoot(t)
	bin := testkit.BuildWireGuardGo(t)
	u := newNS(t, "u")
	a := newTenantNet(t, u, "a", 1)
	tn := a.config(t)
	tn.WireGuard.Address = []netip.Prefix{netip.MustParsePrefix("172.31.0.1/32")}
	// This office's tunnel runs over the IPv6 underlay, the gateway
	// calling it as well as answering.
	tn.WireGuard.Sites[0].Endpoint = netip.AddrPortFrom(netip.MustParseAddr(a.officeUplnk6), 51820)
	tn.WireGuard.Sites[0].PersistentKeepalive = Keepalive(25 * time.Second)
	gw := startGateway(t, u, gwSpec{Tenants: []gwTenant{tn}})
	a.startOffice(t, bin, true)

	// The interface is in the tenant's namespace, not the underlay.
	if out := run(t, "ip", "-n", a.tenant, "-o", "link", "show", "wg0"); !strings.Contains(out, "mtu 1420") || !strings.Contains(out, "UP") {
		t.Errorf("wg0 in the tenant's namespace: %s", out)
	}
	if out := run(t, "ip", "-n", a.tenant, "-o", "addr", "show", "dev", "wg0"); !strings.Contains(out, "172.31.0.1/32") {
		t.Errorf("wg0's address: %s", out)
	}
	if out := run(t, "ip", "-n", a.tenant, "route", "show", "192.168.1.0/24"); !strings.Contains(out, "dev wg0") {
		t.Errorf("route to the office: %q", out)
	}
	if out, err := tryRun("ip", "-n", u, "link", "show", "wg0"); err == nil {
		t.Errorf("a wg0 in the underlay: %s", out)
	}
	// The UDP port is in the underlay, not in the tenant's namespace.
	if out := run(t, "ip", "netns", "exec", u, "ss", "-Hunl", "sport = :51820"); out == "" {
		t.Errorf("no UDP socket on port 51820 in the underlay")
	}
	if out := run(t, "ip", "netns", "exec", a.tenant, "ss", "-Hunl"); out != "" {
		t.Errorf("UDP sockets in the tenant's namespace:\n%s", out)
	}

	if err := ping(a.lan, "10.0.0.10", 30*time.Second); err != nil {
		t.Fatalf("office LAN host to the desktop: %v", err)
	}
	for _, p := range [][2]string{{a.desktop, "192.168.1.5"}, {a.lan, "fd00:10::10"}, {a.desktop, "fd00:192::5"}} {
		if err := ping(p[0], p[1], 10*time.Second); err != nil {
			t.Fatalf("ping %s: %v", p[1], err)
		}
	}
	tcpEcho(t, a.lan, a.desktop, "10.0.0.10:3389")
	tcpEcho(t, a.desktop, a.lan, "192.168.1.5:445")
	tcpEcho(t, a.lan, a.desktop, "[fd00:10::10]:3390")
	tcpEcho(t, a.desktop, a.lan, "[fd00:192::5]:446")
	if out := run(t, "ip", "netns", "exec", a.office, "wg", "show", "all", "endpoints"); !strings.Contains(out, "["+a.underlayIP6+"]:51820") {
		t.Errorf("the office's tunnel is not over the IPv6 underlay: %s", out)
	}

	m := gw.metrics()
	site := `site="office",tenant="a"`
	if age, ok := metricValue(t, m, "deskway_site_wg_handshake_age_seconds", site); !ok || age < 0 || age > 120 {
		t.Errorf("handshake age %v (present %v)\n%s", age, ok, m)
	}
	if up, _ := metricValue(t, m, "deskway_site_wg_site_up", site); up != 1 {
		t.Errorf("site up %v", up)
	}
	for _, name := range []string{"deskway_site_wg_receive_bytes_total", "deskway_site_wg_transmit_bytes_total"} {
		if v, _ := metricValue(t, m, name, site); v < 4<<20 {
			t.Errorf("%s %v: under the 4 MiB the echoes moved each way", name, v)
		}
	}

	// The private key never reaches the log, even at Debug.
	keyText, err := os.ReadFile(a.gwKey)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(keyText)))
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.ReadFile(gw.log)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(log, []byte("handshake")) {
		t.Errorf("the gateway's debug log shows no handshake: the key check below would prove nothing\n%s", log)
	}
	for _, form := range []string{strings.TrimSpace(string(keyText)), hex.EncodeToString(raw)} {
		if bytes.Contains(log, []byte(form)) {
			t.Errorf("the gateway logged its private key")
		}
	}

	// A stop removes the interface and its routes from the tenant's
	// namespace, and the port from the underlay.
	gw.stop()
	if out, err := tryRun("ip", "-n", a.tenant, "link", "show", "wg0"); err == nil {
		t.Errorf("wg0 is still in the tenant's namespace after the stop: %s", out)
	}
	if out := run(t, "ip", "netns", "exec", u, "ss", "-Hunl", "sport = :51820"); out != "" {
		t.Errorf("port 51820 still open after the stop: %s", out)
	}
	// A clean run warns of nothing: a warning here is a fault of ours
	// (wireguard-go reports a TUN it cannot query, for one).
	log, err = os.ReadFile(gw.log)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("gateway log: %s", l)
		}
	}
}

func TestWireGuardTenantsIsolated(t *testing.T) {
	needRoot(t)
	bin := testkit.BuildWireGuardGo(t)
	u := newNS(t, "u")
	nets := []*tenantNet{newTenantNet(t, u, "a", 1), newTenantNet(t, u, "b", 2)}
	var spec gwSpec
	for _, n := range nets {
		tn := n.config(t)
		tn.WireGuard.Interface = "wg-" + n.name
		spec.Tenants = append(spec.Tenants, tn)
	}
	gw := startGateway(t, u, spec)
	for _, n := range nets {
		n.startOffice(t, bin, false)
		// Both desktops are 10.0.0.10 and fd00:10::10, both offices'
		// LAN hosts 192.168.1.5 and fd00:192::5: the desktop names its
		// tenant, and who called.
		for _, addr := range []string{"10.0.0.10:3389", "[fd00:10::10]:3389"} {
			ln := listenTCP(t, n.desktop, addr)
			go func(tenant string) {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					_, _ = io.WriteString(c, "desktop of tenant "+tenant+", called by "+c.RemoteAddr().(*net.TCPAddr).IP.String()+"\n")
					c.Close()
				}
			}(n.name)
		}
	}
	for _, n := range nets {
		if err := ping(n.lan, "10.0.0.10", 30*time.Second); err != nil {
			t.Fatalf("tenant %s: office LAN host to its desktop: %v", n.name, err)
		}
		for _, p := range [][2]string{{n.desktop, "192.168.1.5"}, {n.lan, "fd00:10::10"}, {n.desktop, "fd00:192::5"}} {
			if err := ping(p[0], p[1], 10*time.Second); err != nil {
				t.Fatalf("tenant %s: ping %s: %v", n.name, p[1], err)
			}
		}
		for _, call := range [][2]string{{"10.0.0.10:3389", "192.168.1.5"}, {"[fd00:10::10]:3389", "fd00:192::5"}} {
			for range 3 {
				c, err := dialTCP(n.lan, call[0])
				if err != nil {
					t.Fatalf("tenant %s: TCP to its desktop %s: %v", n.name, call[0], err)
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				got, err := io.ReadAll(c)
				c.Close()
				if want := "desktop of tenant " + n.name + ", called by " + call[1] + "\n"; string(got) != want || err != nil {
					t.Fatalf("tenant %s's office reached %q (%v), want %q", n.name, got, err, want)
				}
			}
		}
	}
	m := gw.metrics()
	for _, n := range nets {
		if _, ok := metricValue(t, m, "deskway_site_wg_handshake_age_seconds", `site="office",tenant="`+n.name+`"`); !ok {
			t.Errorf("no handshake metric for tenant %s\n%s", n.name, m)
		}
	}
}

// udpTally counts datagrams reaching a listener by phase (the payload)
// and source address.
type udpTally struct {
	mu sync.Mutex
	n  map[string]int // "phase source" -> datagrams
}

func (u *udpTally) serve(c *net.UDPConn) {
	buf := make([]byte, 100)
	for {
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			return
		}
		u.mu.Lock()
		u.n[string(buf[:n])+" "+from.IP.String()]++
		u.mu.Unlock()
	}
}

func (u *udpTally) count(phase, src string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[phase+" "+src]
}

func TestWireGuardWrongKeyAndReload(t *testing.T) {
	needRoot(t)
	bin := testkit.BuildWireGuardGo(t)
	u := newNS(t, "u")
	a := newTenantNet(t, u, "a", 1)
	tn := a.config(t)
	gw := startGateway(t, u, gwSpec{Tenants: []gwTenant{tn}})
	a.startOffice(t, bin, false)

	// Another office, whose key the gateway does not know, with the
	// gateway's right public key and port, claiming 192.168.9.0/24.
	w := newNS(t, "w")
	veth(t, u, "up9", "172.30.9.1/24", w, "up0", "172.30.9.2/24")
	wKey, wPub := testkit.WireGuardKey(t, t.TempDir(), "office-w")
	wo := testkit.StartWireGuardOffice(t, bin, w, wKey, "192.168.9.1/24", a.gwPub, "172.30.9.1:51820", "10.0.0.0/24")

	tally := &udpTally{n: map[string]int{}}
	go tally.serve(listenUDP(t, a.desktop, "10.0.0.10:9000"))
	var fromOffice, fromW net.Conn
	for _, s := range []struct {
		ns string
		c  *net.Conn
	}{{a.lan, &fromOffice}, {w, &fromW}} {
		if err := inNS(s.ns, func() (err error) { *s.c, err = net.Dial("udp4", "10.0.0.10:9000"); return err }); err != nil {
			t.Fatal(err)
		}
		defer (*s.c).Close()
	}
	// send sends the phase's datagram from both offices in turn until
	// each source in until has had 10 arrive; the other's count is then
	// the answer.
	send := func(phase string, until ...string) {
		t.Helper()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		end := time.Now().Add(30 * time.Second)
		for _, src := range until {
			for ; tally.count(phase, src) < 10; <-tick.C {
				if time.Now().After(end) {
					t.Fatalf("phase %s: only %d datagrams from %s reached the desktop in 30s", phase, tally.count(phase, src), src)
				}
				_, _ = fromOffice.Write([]byte(phase))
				_, _ = fromW.Write([]byte(phase))
			}
		}
	}
	officeRx := func() float64 {
		t.Helper()
		v, ok := metricValue(t, gw.metrics(), "deskway_site_wg_receive_bytes_total", `site="office",tenant="a"`)
		if !ok {
			t.Fatal("no receive counter for the office")
		}
		return v
	}

	send("1", "192.168.1.5")
	if n := tally.count("1", "192.168.9.1"); n != 0 {
		t.Errorf("an office with an unknown key got %d datagrams to the desktop", n)
	}
	if hs := wo.Handshakes(t); !strings.HasSuffix(hs, "\t0") {
		t.Errorf("the unknown office completed a handshake: %q", hs)
	}

	// The other office is added as a site: it gets through, and the
	// office keeps its session (its peer is not made anew: the device's
	// byte count for it goes on from where it was).
	wpub, err := ParsePublicKey(wPub)
	if err != nil {
		t.Fatal(err)
	}
	wSite := Site{Name: "w", PublicKey: wpub, Prefixes: []netip.Prefix{netip.MustParsePrefix("192.168.9.0/24")}}
	before := officeRx()
	tn.WireGuard.Sites = append(tn.WireGuard.Sites, wSite)
	gw.reload(gwSpec{Tenants: []gwTenant{tn}})
	if after := officeRx(); after < before {
		t.Errorf("the reload made the office's peer anew (received bytes %v, were %v): its session was dropped", after, before)
	}
	send("2", "192.168.9.1", "192.168.1.5")

	// The office's site is revoked: the same probes now reach from the
	// other site only, and at once.
	tn.WireGuard.Sites = []Site{wSite}
	gw.reload(gwSpec{Tenants: []gwTenant{tn}})
	send("3", "192.168.9.1")
	if n := tally.count("3", "192.168.1.5"); n != 0 {
		t.Errorf("a revoked office still got %d datagrams to the desktop", n)
	}
	if err := ping(w, "10.0.0.10", 10*time.Second); err != nil {
		t.Errorf("the new site to the desktop: %v", err)
	}
	if out := run(t, "ip", "-n", a.tenant, "route", "show", "dev", "wg0"); strings.Contains(out, "192.168.1.0/24") || !strings.Contains(out, "192.168.9.0/24") {
		t.Errorf("routes through wg0 after the reload:\n%s", out)
	}
	m := gw.metrics()
	if _, ok := metricValue(t, m, "deskway_site_wg_handshake_age_seconds", `site="w",tenant="a"`); !ok {
		t.Errorf("no handshake metric for the new site\n%s", m)
	}
	if strings.Contains(m, `site="office"`) {
		t.Errorf("the revoked site is still in the metrics")
	}
}
