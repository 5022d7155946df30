package wg

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// The tests below build small networks of namespaces, all named by the
// test with a random suffix and deleted when it ends, pass or fail:
//
//	office LAN host ── office router (wireguard-go, configured by wg)
//	    192.168.1.5        │ 172.30.N.2
//	                       │ veth (the internet)
//	                       │ 172.30.N.1
//	                 underlay (the gateway process: UDP ports)
//	                       ┆ WireGuard TUN in the tenant's namespace
//	                 tenant namespace ── desktop 10.0.0.10
//	                       10.0.0.1

// needRoot skips without root, and fails under CI where root is given.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("the WireGuard site tests need root (network namespaces)")
		}
		t.Skip("needs root: network namespaces")
	}
	for _, tool := range []string{"ip", "wg"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: run scripts/install-deps.sh (iproute2, wireguard-tools)", tool)
		}
	}
}

func suffix(t *testing.T) string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// run runs a command and fails the test with its output if it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// tryRun runs a command that may fail.
func tryRun(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// newNS makes a namespace with lo up; it is deleted when the test ends.
func newNS(t *testing.T, role string) string {
	t.Helper()
	name := "dwwg-" + role + "-" + suffix(t)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v %s", name, err, out)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// veth joins two namespaces, addresses both ends and brings them up.
// The pair is made directly inside the namespaces: the root namespace
// never sees it.
func veth(t *testing.T, nsA, ifA, addrA, nsB, ifB, addrB string) {
	t.Helper()
	run(t, "ip", "link", "add", ifA, "netns", nsA, "type", "veth", "peer", "name", ifB, "netns", nsB)
	for _, e := range [][3]string{{nsA, ifA, addrA}, {nsB, ifB, addrB}} {
		run(t, "ip", "-n", e[0], "addr", "add", e[2], "dev", e[1])
		run(t, "ip", "-n", e[0], "link", "set", e[1], "up")
	}
}

// addr6 adds an IPv6 address usable at once (no duplicate detection).
func addr6(t *testing.T, ns, ifname, addr string) {
	t.Helper()
	run(t, "ip", "-n", ns, "addr", "add", addr, "dev", ifname, "nodad")
}

func forwarding(t *testing.T, ns string) {
	t.Helper()
	run(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
}

// inNS runs fn on a thread inside the namespace; sockets fn opens stay
// there when the thread returns home.
func inNS(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer home.Close()
		target, err := netns.GetFromName(name)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(home); err != nil {
			errc <- err
			return // the thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func listenTCP(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := inNS(ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func dialTCP(ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNS(ns, func() (err error) { c, err = net.DialTimeout("tcp", addr, 5*time.Second); return err })
	return c, err
}

func listenUDP(t *testing.T, ns, addr string) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := inNS(ns, func() error {
		pc, err := net.ListenPacket("udp4", addr)
		if err == nil {
			c = pc.(*net.UDPConn)
		}
		return err
	})
	if err != nil {
		t.Fatalf("listen udp %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ping sends ICMP echo requests from ns to dst until one is answered by
// dst or the deadline passes. ICMP goes through the kernels of both
// ends: nothing of ours answers it.
func ping(ns, dst string, deadline time.Duration) error {
	network, laddr, proto := "ip4:icmp", "0.0.0.0", 1
	var echo, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if strings.Contains(dst, ":") {
		network, laddr, proto = "ip6:ipv6-icmp", "::", 58
		echo, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	var c *icmp.PacketConn
	if err := inNS(ns, func() (err error) { c, err = icmp.ListenPacket(network, laddr); return err }); err != nil {
		return fmt.Errorf("icmp socket in %s: %w", ns, err)
	}
	defer c.Close()
	to := &net.IPAddr{IP: net.ParseIP(dst)}
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := int(idb[0])<<8 | int(idb[1])
	end := time.Now().Add(deadline)
	buf := make([]byte, 1500)
	for seq := 1; time.Now().Before(end); seq++ {
		msg := icmp.Message{Type: echo, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("deskway wg test")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, to); err != nil {
			return fmt.Errorf("icmp to %s: %w", dst, err)
		}
		wait := time.Now().Add(500 * time.Millisecond)
		_ = c.SetReadDeadline(wait)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				break // no answer to this one: send the next
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != reply || from.String() != dst {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && e.Seq == seq {
				return nil
			}
		}
	}
	return fmt.Errorf("no echo reply from %s to %s within %s", dst, ns, deadline)
}

// tenantNet is one tenant's side of a test: its namespace with the
// desktop behind it, and its office with a LAN host behind that.
type tenantNet struct {
	name                      string
	tenant, desktop           string // namespaces
	office, lan               string // namespaces
	port                      int    // the gateway's UDP port for this tenant
	gwKey, gwPub              string // the gateway's key file and public key
	officeKey, officePub      string
	underlayIP, officeUplnk   string // IPv4 underlay
	underlayIP6, officeUplnk6 string // IPv6 underlay
}

// newTenantNet builds tenant n's namespaces; idx picks its underlay
// subnets (172.30.idx.0/24, fd00:30:idx::/64) and its port (51819+idx).
// Inside, both IPv4 and IPv6: the desktop is 10.0.0.10 and fd00:10::10,
// the office LAN host 192.168.1.5 and fd00:192::5.
func newTenantNet(t *testing.T, underlay, name string, idx int) *tenantNet {
	t.Helper()
	dir := t.TempDir()
	n := &tenantNet{name: name, port: 51819 + idx}
	n.tenant = newNS(t, "t"+name)
	n.desktop = newNS(t, "d"+name)
	n.office = newNS(t, "o"+name)
	n.lan = newNS(t, "l"+name)
	n.underlayIP = fmt.Sprintf("172.30.%d.1", idx)
	n.officeUplnk = fmt.Sprintf("172.30.%d.2", idx)
	n.underlayIP6 = fmt.Sprintf("fd00:30:%d::1", idx)
	n.officeUplnk6 = fmt.Sprintf("fd00:30:%d::2", idx)
	veth(t, n.tenant, "lan0", "10.0.0.1/24", n.desktop, "eth0", "10.0.0.10/24")
	addr6(t, n.tenant, "lan0", "fd00:10::1/64")
	addr6(t, n.desktop, "eth0", "fd00:10::10/64")
	run(t, "ip", "-n", n.desktop, "route", "add", "default", "via", "10.0.0.1")
	run(t, "ip", "-n", n.desktop, "-6", "route", "add", "default", "via", "fd00:10::1")
	forwarding(t, n.tenant)
	up := fmt.Sprintf("up%d", idx)
	veth(t, underlay, up, n.underlayIP+"/24", n.office, "up0", n.officeUplnk+"/24")
	addr6(t, underlay, up, n.underlayIP6+"/64")
	addr6(t, n.office, "up0", n.officeUplnk6+"/64")
	veth(t, n.office, "lan0", "192.168.1.1/24", n.lan, "eth0", "192.168.1.5/24")
	addr6(t, n.office, "lan0", "fd00:192::1/64")
	addr6(t, n.lan, "eth0", "fd00:192::5/64")
	run(t, "ip", "-n", n.lan, "route", "add", "default", "via", "192.168.1.1")
	run(t, "ip", "-n", n.lan, "-6", "route", "add", "default", "via", "fd00:192::1")
	forwarding(t, n.office)
	n.gwKey, n.gwPub = testkit.WireGuardKey(t, dir, "gateway-"+name)
	n.officeKey, n.officePub = testkit.WireGuardKey(t, dir, "office-"+name)
	return n
}

// config is the gateway's WireGuard section for the tenant: one site,
// the office, whose LAN is 192.168.1.0/24 and fd00:192::/64.
func (n *tenantNet) config(t *testing.T) gwTenant {
	t.Helper()
	pub, err := ParsePublicKey(n.officePub)
	if err != nil {
		t.Fatal(err)
	}
	return gwTenant{
		Name:      n.name,
		Namespace: "/run/netns/" + n.tenant,
		WireGuard: Config{
			ListenPort: n.port,
			PrivateKey: "file:" + n.gwKey,
			Sites: []Site{{
				Name:      "office",
				PublicKey: pub,
				Prefixes:  []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("fd00:192::/64")},
			}},
		},
	}
}

// startOffice starts the tenant's office router: wireguard-go with the
// gateway's public key, sending the tenant's hosted networks into the
// tunnel, which runs over the IPv6 underlay if ipv6.
func (n *tenantNet) startOffice(t *testing.T, bin string, ipv6 bool) *testkit.WireGuardOffice {
	gw := netip.AddrPortFrom(netip.MustParseAddr(n.underlayIP), uint16(n.port))
	if ipv6 {
		gw = netip.AddrPortFrom(netip.MustParseAddr(n.underlayIP6), uint16(n.port))
	}
	return testkit.StartWireGuardOffice(t, bin, n.office, n.officeKey, "", n.gwPub, gw.String(), "10.0.0.0/24,fd00:10::/64")
}
