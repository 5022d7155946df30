package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// newSmallSiteRig is a site rig's bare namespaces: the gateway's (its
// underlay), tenant a's compartment with a desktop 10.0.0.10 behind it
// on a veth (the compartment is 10.0.0.1), and an office router joined
// to the gateway by a veth (198.51.100.1 and .2).
func newSmallSiteRig(t *testing.T) *siteRig {
	testkit.RequireRoot(t)
	testkit.Require(t, "ip", "busybox", "nsenter")
	var b [3]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	r := &siteRig{t: t, bin: build(t), sfx: sfx, gw: "dwxg-" + sfx,
		comp: map[string]string{"a": "dwxc-" + sfx}, desk: map[string]string{"a": "dwxd-" + sfx},
		office: map[string]string{"a": "dwxo-" + sfx}, officeLAN: map[string]string{"a": "dwxl-" + sfx},
		officeProc: map[string]*testkit.Process{}}
	r.addNS(r.gw, r.comp["a"], r.desk["a"], r.office["a"])
	r.veth(r.comp["a"], "hosted", r.desk["a"], "eth0")
	r.ip(r.comp["a"], "addr", "add", "10.0.0.1/24", "dev", "hosted")
	r.ip(r.desk["a"], "addr", "add", "10.0.0.10/24", "dev", "eth0")
	r.ip(r.desk["a"], "route", "add", "default", "via", "10.0.0.1")
	r.veth(r.gw, "ul0", r.office["a"], "ul0")
	r.ip(r.gw, "addr", "add", "198.51.100.1/24", "dev", "ul0")
	r.ip(r.office["a"], "addr", "add", "198.51.100.2/24", "dev", "ul0")
	return r
}

const siteWireGuardConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["e2e-admin-token"]}
site:
  tenants:
  - name: a
    key: 1001
    namespace: %[2]s
    prefixes: [10.0.0.0/24]
    wireguard:
      listen_port: 51820
      private_key: file:%[3]s
      sites:
      - name: office
        public_key: %[4]s
        prefixes: [192.168.1.0/24]
`

// TestSiteWireGuardOffice: an office whose router is wireguard-go's own
// program, configured with wg, reaches its tenant's desktop through
// deskway site over WireGuard, and the desktop reaches back; stopping
// the gateway removes the interface from the tenant's namespace.
func TestSiteWireGuardOffice(t *testing.T) {
	parallel(t)
	testkit.Require(t, "wg")
	r := newSmallSiteRig(t)
	dir := t.TempDir()
	gwKey, gwPub := testkit.WireGuardKey(t, dir, "gateway")
	officeKey, officePub := testkit.WireGuardKey(t, dir, "office")
	r.gwCfg = filepath.Join(dir, "gateway.yaml")
	writeFile(t, r.gwCfg, fmt.Sprintf(siteWireGuardConfig, filepath.Join(dir, "state"), r.comp["a"], gwKey, officePub))
	r.gwProc = testkit.Start(t, nil, "nsenter", append([]string{"--net=/run/netns/" + r.gw}, r.docCommand("site-run")...)...)
	waitLog(t, r.gwProc, `"msg":"site gateway forwarding"`)
	if !strings.Contains(r.gwProc.Log.String(), gwPub) {
		t.Fatalf("the gateway did not log its public key %s:\n%s", gwPub, tail(r.gwProc.Log.String(), 3000))
	}
	r.tunnelsMatch(`(?m)^a\s+1001\s+office\s+wireguard\s+down\s+-\s+0\s+-\s+0$`)
	// The office's host is the router's own tunnel address.
	testkit.StartWireGuardOffice(t, testkit.BuildWireGuardGo(t), r.office["a"], officeKey, "192.168.1.10/32",
		gwPub, "198.51.100.1:51820", "10.0.0.0/24")
	eventually(t, 30*time.Second, "the office pings the desktop over WireGuard", func() (bool, string) {
		out, err := r.exec(r.office["a"], "busybox", "ping", "-c", "1", "-W", "1", "-I", "192.168.1.10", "10.0.0.10")
		return err == nil, out
	})
	serveLetter(t, r.desk["a"], "10.0.0.10:7000", "A")
	serveLetter(t, r.office["a"], "192.168.1.10:7001", "O")
	if got, err := askLetter(t, r.office["a"], "10.0.0.10:7000"); err != nil || got != "A" {
		t.Fatalf("office to desktop over TCP: %q, %v", got, err)
	}
	if got, err := askLetter(t, r.desk["a"], "192.168.1.10:7001"); err != nil || got != "O" {
		t.Fatalf("desktop to office over TCP: %q, %v", got, err)
	}
	// The operator's view: the site up (a fresh handshake), with what
	// crossed it.
	r.tunnelsMatch(`(?m)^a\s+1001\s+office\s+wireguard\s+up\s+-\s+[1-9]\d*\s+-\s+[1-9]\d*$`)
	if out, err := r.exec(r.gw, "ip", "link", "show", "wg0"); err == nil {
		t.Fatalf("wg0 is in the gateway's own namespace, not the tenant's:\n%s", out)
	}
	r.stop(r.gwProc)
	if out, err := r.exec(r.comp["a"], "ip", "link", "show", "wg0"); err == nil {
		t.Fatalf("the gateway stopped and wg0 is still in the tenant's namespace:\n%s", out)
	}
}

// tunnelsMatch runs deskway site tunnels as docs/site.md shows it and
// checks its output has a line matching re.
func (r *siteRig) tunnelsMatch(re string) {
	r.t.Helper()
	out, err := r.exec(r.gw, r.docCommand("site-tunnels")...)
	if err != nil {
		r.t.Fatalf("deskway site tunnels: %v\n%s", err, out)
	}
	if !regexp.MustCompile(re).MatchString(out) {
		r.t.Fatalf("deskway site tunnels has no line matching %s:\n%s", re, out)
	}
}

const siteBGPGatewayConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["e2e-admin-token"]}
site:
  underlay:
    addresses: [198.51.100.1]
  tenants:
  - name: a
    key: 1001
    namespace: %[2]s
    prefixes: [10.0.0.0/24]
    sites:
    - name: office
      peer: 198.51.100.2
      prefixes: [192.168.1.10/32]    # the office router's own address
    bgp:
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

// The office's router: GRE to the gateway, its network a namespace the
// test made, where FRR and the office's hosts live.
const siteBGPOfficeConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["e2e-admin-token"]}
site:
  underlay:
    addresses: [198.51.100.2]
  tenants:
  - name: office
    key: 1001
    namespace: %[2]s
    prefixes: [192.168.1.10/32, 192.168.50.0/24]
    sites:
    - name: gateway
      peer: 198.51.100.1
      prefixes: [10.0.0.0/24]
`

const siteBGPFRRConfig = `frr defaults traditional
hostname office
router bgp 65001
 bgp router-id 192.168.1.10
 no bgp ebgp-requires-policy
 no bgp network import-check
 neighbor 10.0.0.1 remote-as 65000
 neighbor 10.0.0.1 update-source 192.168.1.10
 neighbor 10.0.0.1 ebgp-multihop 2
 neighbor 10.0.0.1 timers 3 9
 neighbor 10.0.0.1 timers connect 1
 address-family ipv4 unicast
  network 192.168.50.0/24
 exit-address-family
`

// TestSiteBGPLearnt: FRR in the office's network, reaching the gateway
// through the office's GRE tunnel, announces 192.168.50.0/24, which no
// configuration routes; the desktop then reaches a host there through
// the tunnel, and the route goes when the gateway stops.
func TestSiteBGPLearnt(t *testing.T) {
	parallel(t)
	r := newSmallSiteRig(t)
	lan := r.officeLAN["a"]
	r.addNS(lan)
	r.ip(lan, "addr", "add", "192.168.1.10/32", "dev", "lo")
	r.ip(lan, "addr", "add", "192.168.50.10/32", "dev", "lo")
	dir := t.TempDir()
	r.gwCfg = filepath.Join(dir, "gateway.yaml")
	writeFile(t, r.gwCfg, fmt.Sprintf(siteBGPGatewayConfig, filepath.Join(dir, "gw-state"), r.comp["a"]))
	r.gwProc = testkit.Start(t, nil, "nsenter", append([]string{"--net=/run/netns/" + r.gw}, r.docCommand("site-run")...)...)
	waitLog(t, r.gwProc, `"msg":"site gateway forwarding"`)
	officeCfg := filepath.Join(dir, "office.yaml")
	writeFile(t, officeCfg, fmt.Sprintf(siteBGPOfficeConfig, filepath.Join(dir, "office-state"), lan))
	r.officeProc["a"] = testkit.Start(t, nil, "nsenter", "--net=/run/netns/"+r.office["a"], r.bin, "site", "-c", officeCfg)
	waitLog(t, r.officeProc["a"], `"msg":"site gateway forwarding"`)

	// Before BGP, nothing routes 192.168.50.0/24 in the tenant's namespace.
	if out, _ := r.exec(r.comp["a"], "ip", "route", "show", "192.168.50.0/24"); strings.TrimSpace(out) != "" {
		t.Fatalf("a route to 192.168.50.0/24 before BGP: %s", out)
	}
	frr := testkit.StartFRR(t, lan, siteBGPFRRConfig)
	eventually(t, 60*time.Second, "the gateway learns 192.168.50.0/24 and routes it to the tunnel", func() (bool, string) {
		out, _ := r.exec(r.comp["a"], "ip", "route", "show", "192.168.50.0/24")
		return strings.Contains(out, "dev dw-a"), out + "\n" + frr.Vtysh(t, "show bgp summary") + tail(r.gwProc.Log.String(), 3000)
	})
	if out, err := r.exec(r.desk["a"], "busybox", "ping", "-c", "2", "-W", "3", "192.168.50.10"); err != nil {
		t.Fatalf("the desktop pings 192.168.50.10 behind the office: %v\n%s", err, out)
	}
	serveLetter(t, lan, "192.168.50.10:7002", "L")
	if got, err := askLetter(t, r.desk["a"], "192.168.50.10:7002"); err != nil || got != "L" {
		t.Fatalf("desktop to the learnt network over TCP: %q, %v", got, err)
	}
	// FRR learnt the hosted network the gateway announces.
	if out := frr.Vtysh(t, "show ip bgp json"); !strings.Contains(out, "10.0.0.0/24") {
		t.Fatalf("FRR has not learnt 10.0.0.0/24:\n%s", out)
	}
	r.stop(r.gwProc)
	if out, err := r.exec(r.comp["a"], "ip", "route", "show", "192.168.50.0/24"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("the gateway stopped and the learnt route is still there: %s %v", out, err)
	}
}
