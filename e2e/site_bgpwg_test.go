package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// siteBGPOverWireGuard is tenant a's speaker beside its WireGuard site.
const siteBGPOverWireGuard = `    bgp:
      asn: 65000
      router_id: 10.0.0.1
      listen: [10.0.0.1]
      peers:
      - address: 192.168.1.10
        asn: 65001
        hold_time: 9s
      announce: [10.0.0.0/24]
      accept: [192.168.0.0/16]
`

// TestSiteBGPOverWireGuard: FRR on an office's WireGuard router (wireguard-go
// configured with wg) reaches the gateway's speaker through the tunnel
// and announces 192.168.50.0/24, which no file routes; the gateway routes
// it through the tenant's WireGuard interface and accepts it among the
// office's allowed IPs, so the desktop and a host there reach each other.
func TestSiteBGPOverWireGuard(t *testing.T) {
	parallel(t)
	testkit.Require(t, "wg")
	r := newSmallSiteRig(t)
	office := r.office["a"]
	dir := t.TempDir()
	gwKey, gwPub := testkit.WireGuardKey(t, dir, "gateway")
	officeKey, officePub := testkit.WireGuardKey(t, dir, "office")
	r.gwCfg = filepath.Join(dir, "gateway.yaml")
	writeFile(t, r.gwCfg, fmt.Sprintf(siteWireGuardConfig, filepath.Join(dir, "state"), r.comp["a"], gwKey, officePub)+siteBGPOverWireGuard)
	r.gwProc = testkit.Start(t, nil, "nsenter", append([]string{"--net=/run/netns/" + r.gw}, r.docCommand("site-run")...)...)
	waitLog(t, r.gwProc, `"msg":"site gateway forwarding"`)
	r.ip(office, "addr", "add", "192.168.50.10/32", "dev", "lo")
	testkit.StartWireGuardOffice(t, testkit.BuildWireGuardGo(t), office, officeKey, "192.168.1.10/32",
		gwPub, "198.51.100.1:51820", "10.0.0.0/24")
	eventually(t, 30*time.Second, "the office pings the desktop over WireGuard", func() (bool, string) {
		out, err := r.exec(office, "busybox", "ping", "-c", "1", "-W", "1", "-I", "192.168.1.10", "10.0.0.10")
		return err == nil, out
	})
	frr := testkit.StartFRR(t, office, siteBGPFRRConfig)
	eventually(t, 60*time.Second, "the gateway learns 192.168.50.0/24 and routes it through wg0", func() (bool, string) {
		out, _ := r.exec(r.comp["a"], "ip", "route", "show", "192.168.50.0/24")
		return strings.Contains(out, "dev wg0"), out + "\n" + frr.Vtysh(t, "show bgp summary") + tail(r.gwProc.Log.String(), 3000)
	})
	// The desktop's packets go to the office, and the answers from
	// 192.168.50.10 are accepted from the office's peer.
	if out, err := r.exec(r.desk["a"], "busybox", "ping", "-c", "2", "-W", "3", "192.168.50.10"); err != nil {
		t.Fatalf("the desktop pings 192.168.50.10 behind the WireGuard office: %v\n%s", err, out)
	}
	serveLetter(t, office, "192.168.50.10:7002", "L")
	if got, err := askLetter(t, r.desk["a"], "192.168.50.10:7002"); err != nil || got != "L" {
		t.Fatalf("desktop to the learnt network over TCP: %q, %v", got, err)
	}
	r.stop(r.gwProc)
}
