package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// keepaliveScript sends, from an office router's underlay address, a
// keepalive as Cisco's routers build it (scapy, independent of
// deskway): GRE with the tenant's key whose inner packet is GRE again,
// from the gateway's address back to the router's, and prints what
// comes back from the gateway.
const keepaliveScript = `from scapy.all import *
import threading
conf.verb = 0
R, GW, KEY, L3 = %q, %q, %d, %s
ready = threading.Event()
sn = AsyncSniffer(iface="ul0", lfilter=lambda p: GRE in p and p[L3].src == GW and p[L3].dst == R, count=1, timeout=10, started_callback=ready.set)
sn.start()
ready.wait(10)
send(L3(src=R, dst=GW)/GRE(key_present=1, key=KEY, proto=%s)/L3(src=GW, dst=R, %s=47)/GRE(key_present=1, key=KEY, proto=0))
sn.join()
for p in sn.results or []:
    g = p[L3][GRE]
    print("BACK key=%%d proto=%%d" %% (g.key, g.proto))
`

// TestSiteKeepalive: a Cisco-style GRE keepalive from an office router,
// over IPv4 and over IPv6, comes back to the router (so routers can
// keep keepalives on), counted, and the site shows up.
func TestSiteKeepalive(t *testing.T) {
	parallel(t)
	requireScapy(t)
	r := newSiteRig(t)
	for _, c := range []struct {
		x, router, gw, l3, proto, next string
		key                            int
	}{
		{"a", "198.51.100.2", "198.51.100.1", "IP", "0x0800", "proto", 1001},
		{"b", "2001:db8:100::3", "2001:db8:100::1", "IPv6", "0x86dd", "nh", 1002},
	} {
		script := fmt.Sprintf(keepaliveScript, c.router, c.gw, c.key, c.l3, c.proto, c.next)
		out, err := r.exec(r.office[c.x], "/usr/bin/python3", "-c", script)
		if err != nil {
			t.Fatalf("scapy: %v\n%s", err, out)
		}
		if want := fmt.Sprintf("BACK key=%d proto=0", c.key); !strings.Contains(out, want) {
			t.Fatalf("office %s's keepalive did not come back from the gateway (want %q):\n%s\n%s", c.x, want, out, tail(r.gwProc.Log.String(), 2000))
		}
		series := fmt.Sprintf(`deskway_site_keepalives_total{tenant=%q}`, c.x)
		eventually(t, 5*time.Second, series, func() (bool, string) {
			n := r.metric(series)
			return n == 1, fmt.Sprint(n)
		})
		if n := r.metric(fmt.Sprintf(`deskway_site_drops_total{cause="spoofed",tenant=%q}`, c.x)); n != 0 {
			t.Fatalf("tenant %s: %v keepalives dropped as spoofed", c.x, n)
		}
	}
}
