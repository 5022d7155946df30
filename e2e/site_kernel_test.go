package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// siteKernelGatewayConfig: two tenants with the same hosted and office
// networks, both over IPv4 and without sequence numbers or checksums,
// so the kernel datapath carries both.
const siteKernelGatewayConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["e2e-admin-token"]}
site:
  datapath: kernel
  underlay:
    addresses: [198.51.100.1]
  tenants:
  - name: a
    key: 1001
    namespace: %[2]s
    prefixes: [10.0.0.0/24, "fd00:10::/64"]
    sites:
    - {name: office-a, peer: 198.51.100.2, prefixes: [192.168.1.0/24, "fd00:192::/64"]}
  - name: b
    key: 1002
    namespace: %[3]s
    prefixes: [10.0.0.0/24, "fd00:10::/64"]
    sites:
    - {name: office-b, peer: 198.51.100.3, prefixes: [192.168.1.0/24, "fd00:192::/64"]}
`

// newKernelSiteRig is newSiteRig's world with both offices on IPv4
// (198.51.100.2 and .3) and every deskway site on the kernel datapath.
func newKernelSiteRig(t *testing.T) *siteRig {
	r := newSiteWorld(t, "dwk",
		map[string]string{"a": "198.51.100.2", "b": "198.51.100.3"},
		map[string]string{"a": "198.51.100.2/24", "b": "198.51.100.3/24"})
	for _, x := range []string{"a", "b"} {
		r.addTenantNets(x)
	}
	dir := t.TempDir()
	r.gwCfg = filepath.Join(dir, "gateway.yaml")
	writeFile(t, r.gwCfg, fmt.Sprintf(siteKernelGatewayConfig, filepath.Join(dir, "gw-state"), r.comp["a"], r.comp["b"]))
	r.gwProc = testkit.Start(t, nil, "nsenter", "--net=/run/netns/"+r.gw, r.bin, "site", "-c", r.gwCfg)
	waitLog(t, r.gwProc, `"msg":"site gateway forwarding"`)
	for i, x := range []string{"a", "b"} {
		body := strings.Replace(fmt.Sprintf(siteOfficeConfig, filepath.Join(dir, "office-"+x+"-state"), r.underlay[x], 1001+i, r.officeLAN[x], "198.51.100.1", false, 1400),
			"site:\n", "site:\n  datapath: kernel\n", 1)
		r.startOffice(x, body)
	}
	return r
}

// vethBytes is the bytes received and sent by interface dev in ns.
func (r *siteRig) vethBytes(ns, dev string) (rx, tx uint64) {
	r.t.Helper()
	out, err := r.exec(ns, "ip", "-s", "-j", "link", "show", dev)
	if err != nil {
		r.t.Fatalf("ip -s link show %s in %s: %v\n%s", dev, ns, err, out)
	}
	var links []struct {
		Stats struct {
			RX struct{ Bytes uint64 } `json:"rx"`
			TX struct{ Bytes uint64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		r.t.Fatalf("ip -j link show %s: %v\n%s", dev, err, out)
	}
	return links[0].Stats.RX.Bytes, links[0].Stats.TX.Bytes
}

// TestSiteKernelTenantsOverlap: with the kernel datapath at the gateway
// and at both offices, two tenants with the same hosted and office
// networks each reach only their own desktop (TCP and ICMP, inner IPv4
// and IPv6 over an IPv4 underlay); the megabytes go through the tenants'
// veths, not the TUN devices, and the admin API counts them under the
// kernel datapath.
func TestSiteKernelTenantsOverlap(t *testing.T) {
	parallel(t)
	r := newKernelSiteRig(t)
	waitLog(t, r.gwProc, `"datapath":"kernel"`)
	for _, x := range []string{"a", "b"} {
		serveLetter(t, r.desk[x], "10.0.0.10:7000", strings.ToUpper(x))
		serveLetter(t, r.desk[x], "[fd00:10::10]:7000", strings.ToUpper(x))
	}
	for _, x := range []string{"a", "b"} {
		for _, ping := range [][]string{{"192.168.1.10", "10.0.0.10"}, {"fd00:192::10", "fd00:10::10"}} {
			if out, err := r.exec(r.officeLAN[x], "busybox", "ping", "-c", "2", "-W", "3", "-I", ping[0], ping[1]); err != nil {
				t.Fatalf("office %s pings desktop %s: %v\n%s", x, ping[1], err, out)
			}
		}
		for _, addr := range []string{"10.0.0.10:7000", "[fd00:10::10]:7000"} {
			got, err := askLetter(t, r.officeLAN[x], addr)
			if err != nil {
				t.Fatalf("office %s: TCP to %s: %v", x, addr, err)
			}
			if want := strings.ToUpper(x); got != want {
				t.Fatalf("office %s reached desktop %s at %s", x, got, addr)
			}
		}
	}
	for i, x := range []string{"a", "b"} {
		veth := "dwk" + strconv.FormatUint(uint64(0x3e9+i), 16)
		if rx, _ := r.vethBytes(r.comp[x], veth); rx < 2<<20 {
			t.Fatalf("tenant %s's veth %s received %d bytes, not the 2 MiB its office sent", x, veth, rx)
		}
		if rx, tx := r.vethBytes(r.comp[x], "dw-"+x); rx+tx > 256<<10 {
			t.Fatalf("tenant %s's TUN device carried %d bytes in and %d out: the userspace datapath forwarded the traffic", x, tx, rx)
		}
	}
	r.tunnelsMatch(`(?m)^a\s+1001\s+office-a\s+198\.51\.100\.2\s+up\s+[1-9]\d*\s+[1-9]\d*\s+[1-9]\d*\s+[1-9]\d*\s+kernel$`)
	out, err := r.exec(r.gw, "curl", "-sk", "-H", "Authorization: Bearer e2e-admin-token", "https://127.0.0.1:9443/api/v1/site/tunnels")
	if err != nil {
		t.Fatalf("GET /api/v1/site/tunnels: %v\n%s", err, out)
	}
	for _, site := range []string{"office-a", "office-b"} {
		re := regexp.MustCompile(`"name":"` + site + `"[^}]*"bytes_in":([0-9]+)[^}]*"datapath":"kernel"`)
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("the admin API shows no %s on the kernel datapath:\n%s", site, out)
		}
		if n, _ := strconv.ParseUint(m[1], 10, 64); n < 2<<20 {
			t.Fatalf("the admin API counts %d bytes in from %s, not the 2 MiB sent", n, site)
		}
	}
	if v := r.metric(`deskway_site_bytes_total{direction="in",tenant="a"}`); v < 2<<20 {
		t.Fatalf("/metrics counts %v bytes in for tenant a", v)
	}
	// A graceful stop takes the veths out of the tenants' namespaces.
	r.stop(r.gwProc)
	if out, err := r.exec(r.comp["a"], "ip", "link", "show", "dwk3e9"); err == nil {
		t.Fatalf("the gateway stopped and its veth is still in tenant a's namespace:\n%s", out)
	}
}

// TestSiteKernelPathMTU: with the kernel datapath, a packet bigger than
// the tunnel's MTU that may not be fragmented is answered by the
// tenant's namespace's kernel at the veth, whose MTU is the tunnel's,
// so the desktop's kernel lowers its path MTU to 1400 with no drop of
// deskway's.
func TestSiteKernelPathMTU(t *testing.T) {
	parallel(t)
	r := newKernelSiteRig(t)
	for _, c := range []struct{ from, to, v string }{{"10.0.0.10", "192.168.1.10", "-4"}, {"fd00:10::10", "fd00:192::10", "-6"}} {
		out, _ := r.exec(r.desk["a"], "busybox", "ping", "-c", "1", "-W", "2", "-s", "1400", "-I", c.from, c.to)
		eventually(t, 10*time.Second, "the desktop's path MTU to "+c.to, func() (bool, string) {
			got, _ := r.exec(r.desk["a"], "ip", c.v, "route", "get", c.to)
			return strings.Contains(got, "mtu 1400"), got + "\nping: " + out
		})
	}
	if got := r.metric(`deskway_site_drops_total{cause="too_big",tenant="a"}`); got != 0 {
		t.Fatalf("too_big drops of tenant a = %v, want 0: deskway saw what the veth's MTU stops", got)
	}
}
