package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestSitePathMTU: a packet bigger than the tunnel's MTU (1400) that may
// not be fragmented gets the answer a router gives, from deskway itself:
// ICMP fragmentation needed (IPv4 with DF) or ICMPv6 packet too big,
// with 1400, so that the sender's kernel lowers its path MTU. The
// device's MTU is raised past the tunnel's first, as an administrator
// might: otherwise the namespace's kernel answers before deskway sees
// the packet. The gateway runs the userspace datapath: with the
// kernel's, the namespace's kernel answers at the veth (see
// TestSiteKernelPathMTU).
func TestSitePathMTU(t *testing.T) {
	parallel(t)
	r := newSiteRigDatapath(t, 1400, "userspace")
	r.ip(r.comp["a"], "link", "set", "dw-a", "mtu", "9000")
	for _, c := range []struct{ from, to, v string }{{"10.0.0.10", "192.168.1.10", "-4"}, {"fd00:10::10", "fd00:192::10", "-6"}} {
		// 1400 bytes of data make a 1428 (IPv4) or 1448 (IPv6) byte
		// packet: it fits the desktop's 1500, so it leaves with DF (or
		// unfragmented, IPv6), and not the tunnel.
		out, _ := r.exec(r.desk["a"], "busybox", "ping", "-c", "1", "-W", "2", "-s", "1400", "-I", c.from, c.to)
		eventually(t, 10*time.Second, "the desktop's path MTU to "+c.to, func() (bool, string) {
			got, _ := r.exec(r.desk["a"], "ip", c.v, "route", "get", c.to)
			return strings.Contains(got, "mtu 1400"), got + "\nping: " + out
		})
	}
	if got := r.metric(`deskway_site_drops_total{cause="too_big",tenant="a"}`); got != 2 {
		t.Fatalf("too_big drops of tenant a = %v, want 2", got)
	}
}

// TestSiteOuterFragments: tunnels of MTU 1500 over an underlay of 1500
// carry full-size packets: the GRE datagrams that do not fit are
// fragmented by the sending kernel (IPv4 and IPv6 underlays alike) and
// reassembled by the receiving one before its raw socket sees them.
func TestSiteOuterFragments(t *testing.T) {
	parallel(t)
	r := newSiteRigMTU(t, 1500)
	serveLetter(t, r.desk["a"], "10.0.0.10:7000", "A")
	serveLetter(t, r.desk["b"], "10.0.0.10:7000", "B")
	for _, x := range []string{"a", "b"} {
		// 1472 bytes of data: a 1500-byte packet, 1524 or more with GRE.
		if out, err := r.exec(r.officeLAN[x], "busybox", "ping", "-c", "2", "-W", "3", "-s", "1472", "-I", "192.168.1.10", "10.0.0.10"); err != nil {
			t.Fatalf("office %s: a 1500-byte ping to 10.0.0.10: %v\n%s", x, err, out)
		}
		got, err := askLetter(t, r.officeLAN[x], "10.0.0.10:7000")
		if err != nil || got != strings.ToUpper(x) {
			t.Fatalf("office %s: TCP through a 1500-byte tunnel: %q, %v", x, got, err)
		}
	}
	for _, series := range []string{`deskway_site_drops_total{cause="too_big",tenant="a"}`, `deskway_site_drops_total{cause="send_error",tenant="b"}`} {
		if got := r.metric(series); got != 0 {
			t.Errorf("%s = %v, want 0", series, got)
		}
	}
}
