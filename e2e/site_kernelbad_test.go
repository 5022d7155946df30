package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSiteKernelSpoofing: with the gateway on the kernel datapath
// (site.datapath: kernel), scapy sends GRE from office a's address with
// tenant a's key: an inner source outside office a's prefixes, tenant b's
// key from office a, a GRE checksum, then a well-formed control. The
// programs leave all but the control to the userspace datapath, which
// drops and counts each under its cause; only the control reaches
// tenant a, and nothing reaches b, whose prefixes are the same.
func TestSiteKernelSpoofing(t *testing.T) {
	parallel(t)
	requireScapy(t)
	r := newKernelSiteRig(t)
	waitLog(t, r.gwProc, `"datapath":"kernel"`)
	attacker := "dwkx-" + r.sfx
	r.addNS(attacker)
	r.veth(attacker, "ul0", r.ul, "x0")
	r.ip(r.ul, "link", "set", "x0", "master", "br0")
	r.ip(attacker, "addr", "add", "198.51.100.66/24", "dev", "ul0")
	frames := []string{
		`IP(src=A, dst=GW)/GRE(key_present=1, key=1001, proto=0x0800)/IP(src="10.9.9.9", dst="10.0.0.10")/ICMP()`,
		`IP(src=A, dst=GW)/GRE(key_present=1, key=1002, proto=0x0800)/INNER`,
		`IP(src=A, dst=GW)/GRE(chksum_present=1, chksum=0x1234, key_present=1, key=1001, proto=0x0800)/INNER`,
		`IP(src=A, dst=GW)/GRE(key_present=1, key=1001, proto=0x0800)/INNER`,
	}
	script := "from scapy.all import *\nconf.verb = 0\nA, GW = \"198.51.100.2\", \"198.51.100.1\"\n" +
		"INNER = IP(src=\"192.168.1.10\", dst=\"10.0.0.10\")/ICMP()\n"
	for _, f := range frames {
		script += fmt.Sprintf("send(%s)\n", f)
	}
	if out, err := r.exec(attacker, "/usr/bin/python3", "-c", script); err != nil {
		t.Fatalf("scapy: %v\n%s", err, out)
	}
	want := map[string]float64{
		`deskway_site_drops_total{cause="spoofed",tenant="a"}`:      1,
		`deskway_site_drops_total{cause="not_peer",tenant="b"}`:     1,
		`deskway_site_drops_total{cause="checksum",tenant=""}`:      1,
		`deskway_site_packets_total{direction="in",tenant="a"}`:     1, // the control
		`deskway_site_packets_total{direction="in",tenant="b"}`:     0,
		`deskway_site_drops_total{cause="device_error",tenant="a"}`: 0,
	}
	eventually(t, 10*time.Second, "every frame counted", func() (bool, string) {
		var wrong []string
		for series, n := range want {
			if got := r.metric(series); got != n {
				wrong = append(wrong, fmt.Sprintf("%s = %v, want %v", series, got, n))
			}
		}
		return len(wrong) == 0, strings.Join(wrong, "; ")
	})
}
