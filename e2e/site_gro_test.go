package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/deskway/deskway/internal/bench/sitebench"
	"github.com/deskway/deskway/internal/testkit"
)

// TestSiteCoalescingUnderlay: an underlay interface that coalesces what
// it receives (GRO, as NICs do by default; the kernel's gre_offload
// merges GRE-carried TCP segments) hands the gateway's raw socket GRE
// datagrams of up to 64 KiB, each a TCP superpacket far bigger than the
// tunnel's MTU. The gateway writes them to the tenant's device for the
// kernel to segment, so TCP from the office reaches the desktop whole
// and nothing is dropped as too big: written as they came, the
// tenant's namespace could not send them on to a desktop behind a
// 1500-byte link.
func TestSiteCoalescingUnderlay(t *testing.T) {
	testkit.RequireRoot(t)
	testkit.Require(t, "ip", "tc", "busybox", "nsenter", "curl")
	var b [3]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	r := &siteRig{t: t, bin: build(t), sfx: sfx, gw: "dwsg-" + sfx,
		comp: map[string]string{"a": "dwsca-" + sfx}, desk: map[string]string{"a": "dwsda-" + sfx},
		office: map[string]string{"a": "dwsoa-" + sfx}, officeLAN: map[string]string{"a": "dwsla-" + sfx},
		officeProc: map[string]*testkit.Process{}}
	r.addNS(r.gw, r.comp["a"], r.desk["a"], r.office["a"])
	// The office's router and the gateway on one veth, whose gateway end
	// coalesces.
	r.veth(r.office["a"], "ul0", r.gw, "ul0")
	r.ip(r.office["a"], "addr", "add", "198.51.100.2/24", "dev", "ul0")
	r.ip(r.gw, "addr", "add", "198.51.100.1/24", "dev", "ul0")
	if err := sitebench.CoalesceReceive(r.gw, "ul0"); err != nil {
		t.Fatal(err)
	}
	r.veth(r.comp["a"], "hosted", r.desk["a"], "eth0")
	r.ip(r.comp["a"], "addr", "add", "10.0.0.1/24", "dev", "hosted")
	r.ip(r.desk["a"], "addr", "add", "10.0.0.10/24", "dev", "eth0")
	r.ip(r.desk["a"], "route", "add", "default", "via", "10.0.0.1")
	dir := t.TempDir()
	r.gwCfg = filepath.Join(dir, "gateway.yaml")
	writeFile(t, r.gwCfg, fmt.Sprintf(`state_dir: %s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["e2e-admin-token"]}
site:
  underlay:
    addresses: [198.51.100.1]
  tenants:
  - name: a
    key: 1001
    namespace: %s
    prefixes: [10.0.0.0/24]
    sites:
    - name: office-a
      peer: 198.51.100.2
      prefixes: [192.168.1.0/24]
`, filepath.Join(dir, "gw-state"), r.comp["a"]))
	r.gwProc = testkit.Start(t, nil, "nsenter", "--net=/run/netns/"+r.gw, r.bin, "site", "-c", r.gwCfg)
	waitLog(t, r.gwProc, `"msg":"site gateway forwarding"`)
	r.startOffice("a", fmt.Sprintf(siteOfficeConfig, filepath.Join(dir, "office-state"), "198.51.100.2", 1001, r.officeLAN["a"], "198.51.100.1", false, 1400))
	serveLetter(t, r.desk["a"], "10.0.0.10:7000", "A")
	for range 3 {
		got, err := askLetter(t, r.officeLAN["a"], "10.0.0.10:7000")
		if err != nil || got != "A" {
			t.Fatalf("1 MiB office → desktop through a coalescing underlay: %q, %v\n%s", got, err, tail(r.gwProc.Log.String(), 2000))
		}
	}
	for _, cause := range []string{"too_big", "device_error"} {
		if got := r.metric(fmt.Sprintf(`deskway_site_drops_total{cause=%q,tenant="a"}`, cause)); got > 0 {
			t.Errorf("tenant a's %s drops = %v, want none", cause, got)
		}
	}
}
