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
// the packet.
func TestSitePathMTU(t *testing.T) {
	r := newSiteRig(t)
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
