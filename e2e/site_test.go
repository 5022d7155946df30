package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"

	"github.com/deskway/deskway/internal/testkit"
)

// siteRig is the site gateway's world, every part a network namespace
// the test made: an underlay bridge; the gateway deskway site with
// tenants a and b, each compartment holding a veth into a desktops
// namespace where 10.0.0.10 lives (the same address for both); and two
// offices whose routers are deskway site too (the kernel has no ip_gre),
// each with 192.168.1.10 in its office network.
type siteRig struct {
	t        *testing.T
	bin, sfx string
	// Namespaces: underlay, gateway, compartments and desktops of a and
	// b, office routers and office networks of a and b.
	ul, gw             string
	comp, desk         map[string]string
	office, officeLAN  map[string]string
	gwProc             *testkit.Process
	gwCfg              string
	officeProc         map[string]*testkit.Process
	underlay, officeUL map[string]string
}

const siteGatewayConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["e2e-admin-token"]}
site:
  underlay:
    addresses: [198.51.100.1, "2001:db8:100::1"]
  tenants:
  - name: a
    key: 1001
    mtu: %[4]d
    namespace: %[2]s
    prefixes: [10.0.0.0/24, "fd00:10::/64"]
    sites:
    - name: office-a
      peer: 198.51.100.2
      prefixes: [192.168.1.0/24, "fd00:192::/64"]
  - name: b
    key: 1002
    mtu: %[4]d
    namespace: %[3]s
    sequence: true
    checksum: true
    prefixes: [10.0.0.0/24, "fd00:10::/64"]
    sites:
    - name: office-b
      peer: "2001:db8:100::3"
      prefixes: [192.168.1.0/24, "fd00:192::/64"]
`

// An office router: one tenant (the office network, a namespace its
// deskway creates) whose one site is the gateway.
const siteOfficeConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["e2e-admin-token"]}
site:
  underlay:
    addresses: [%[2]s]
  tenants:
  - name: office
    key: %[3]d
    mtu: %[7]d
    namespace: %[4]s
    sequence: %[6]v
    prefixes: [192.168.1.0/24, "fd00:192::/64"]
    sites:
    - name: gateway
      peer: "%[5]s"
      prefixes: [10.0.0.0/24, "fd00:10::/64"]
`

func newSiteRig(t *testing.T) *siteRig { return newSiteRigMTU(t, 1400) }

// newSiteWorld makes the namespaces every site rig starts from, named
// with prefix and a random suffix: the underlay's bridge, the gateway
// on it at 198.51.100.1/24, and the offices' underlay addresses (bare,
// and with their prefix length) for tenants a and b.
func newSiteWorld(t *testing.T, prefix string, underlay, officeUL map[string]string) *siteRig {
	testkit.RequireRoot(t)
	testkit.Require(t, "ip", "busybox", "nsenter", "curl")
	var b [3]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	r := &siteRig{t: t, bin: build(t), sfx: sfx, ul: prefix + "u-" + sfx, gw: prefix + "g-" + sfx,
		comp: map[string]string{}, desk: map[string]string{}, office: map[string]string{}, officeLAN: map[string]string{},
		officeProc: map[string]*testkit.Process{}, underlay: underlay, officeUL: officeUL}
	r.addNS(r.ul, r.gw)
	r.ip(r.ul, "link", "add", "br0", "type", "bridge")
	r.ip(r.ul, "link", "set", "br0", "up")
	r.veth(r.gw, "ul0", r.ul, "gw0")
	r.ip(r.ul, "link", "set", "gw0", "master", "br0")
	r.ip(r.gw, "addr", "add", "198.51.100.1/24", "dev", "ul0")
	return r
}

// newSiteRigMTU is newSiteRig with every tunnel's MTU mtu.
func newSiteRigMTU(t *testing.T, mtu int) *siteRig { return newSiteRigDatapath(t, mtu, "auto") }

// newSiteRigDatapath is newSiteRigMTU with the gateway's site.datapath
// datapath.
func newSiteRigDatapath(t *testing.T, mtu int, datapath string) *siteRig {
	r := newSiteWorld(t, "dws",
		map[string]string{"a": "198.51.100.2", "b": "2001:db8:100::3"},
		map[string]string{"a": "198.51.100.2/24", "b": "2001:db8:100::3/64"})
	r.ip(r.gw, "addr", "add", "2001:db8:100::1/64", "dev", "ul0", "nodad")
	for _, x := range []string{"a", "b"} {
		r.addTenantNets(x)
	}
	dir := t.TempDir()
	// nsenter enters the network namespace alone: under ip netns exec,
	// which gives its command a mount namespace of its own, the
	// namespaces an office router creates would not be seen outside.
	r.gwCfg = filepath.Join(dir, "gateway.yaml")
	body := fmt.Sprintf(siteGatewayConfig, filepath.Join(dir, "gw-state"), r.comp["a"], r.comp["b"], mtu)
	writeFile(t, r.gwCfg, strings.Replace(body, "site:\n", "site:\n  datapath: "+datapath+"\n", 1))
	// The gateway starts as docs/site.md says.
	r.gwProc = testkit.Start(t, nil, "nsenter", append([]string{"--net=/run/netns/" + r.gw}, r.docCommand("site-run")...)...)
	waitLog(t, r.gwProc, `"msg":"site gateway forwarding"`)
	for i, x := range []string{"a", "b"} {
		gwAddr := map[string]string{"a": "198.51.100.1", "b": "2001:db8:100::1"}[x]
		r.startOffice(x, fmt.Sprintf(siteOfficeConfig, filepath.Join(dir, "office-"+x+"-state"), r.underlay[x], 1001+i, r.officeLAN[x], gwAddr, x == "b", mtu))
	}
	return r
}

// addTenantNets makes tenant x's compartment with its desktops'
// namespace behind it (10.0.0.10 and fd00:10::10, the compartment
// routing for them), and its office router's namespace on the underlay
// bridge at r.officeUL[x].
func (r *siteRig) addTenantNets(x string) {
	r.comp[x], r.desk[x] = "dwsc"+x+"-"+r.sfx, "dwsd"+x+"-"+r.sfx
	r.office[x], r.officeLAN[x] = "dwso"+x+"-"+r.sfx, "dwsl"+x+"-"+r.sfx
	r.addNS(r.comp[x], r.desk[x], r.office[x])
	// The hosted side: the compartment routes to the desktops.
	r.veth(r.comp[x], "hosted", r.desk[x], "eth0")
	r.ip(r.comp[x], "addr", "add", "10.0.0.1/24", "dev", "hosted")
	r.ip(r.comp[x], "addr", "add", "fd00:10::1/64", "dev", "hosted", "nodad")
	r.ip(r.desk[x], "addr", "add", "10.0.0.10/24", "dev", "eth0")
	r.ip(r.desk[x], "addr", "add", "fd00:10::10/64", "dev", "eth0", "nodad")
	r.ip(r.desk[x], "route", "add", "default", "via", "10.0.0.1")
	r.ip(r.desk[x], "-6", "route", "add", "default", "via", "fd00:10::1")
	// The office router on the underlay.
	r.veth(r.office[x], "ul0", r.ul, "o"+x+"0")
	r.ip(r.ul, "link", "set", "o"+x+"0", "master", "br0")
	r.ip(r.office[x], "addr", "add", r.officeUL[x], "dev", "ul0", "nodad")
}

// startOffice starts office x's router, deskway site with config body
// (whose one tenant's namespace is r.officeLAN[x]), in r.office[x], and
// gives the office network its host, 192.168.1.10 and fd00:192::10
// unless lanHosts names others.
func (r *siteRig) startOffice(x, body string, lanHosts ...string) {
	t := r.t
	cfg := filepath.Join(t.TempDir(), "office-"+x+".yaml")
	writeFile(t, cfg, body)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", r.officeLAN[x]).Run() })
	r.officeProc[x] = testkit.Start(t, nil, "nsenter", "--net=/run/netns/"+r.office[x], r.bin, "site", "-c", cfg)
	waitLog(t, r.officeProc[x], `"msg":"site gateway forwarding"`)
	if len(lanHosts) == 0 {
		lanHosts = []string{"192.168.1.10/32", "fd00:192::10/128"}
	}
	for _, h := range lanHosts {
		r.ip(r.officeLAN[x], "addr", "add", h, "dev", "lo")
	}
}

// docCommand is the command of docs/site.md's block marked
// "<!-- e2e: NAME -->", with the test's binary and gateway config
// in place of deskway and /etc/deskway/deskway.yaml.
func (r *siteRig) docCommand(name string) []string {
	r.t.Helper()
	b, err := os.ReadFile("../docs/site.md")
	if err != nil {
		r.t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- e2e: " + name + " -->\n```sh\n(.*?)\n```").FindSubmatch(b)
	if m == nil {
		r.t.Fatalf("docs/site.md has no sh block marked <!-- e2e: %s -->", name)
	}
	args := strings.Fields(strings.ReplaceAll(string(m[1]), "/etc/deskway/deskway.yaml", r.gwCfg))
	if args[0] != "deskway" {
		r.t.Fatalf("docs/site.md's %s block runs %q, not deskway", name, args[0])
	}
	args[0] = r.bin
	return args
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitLog waits for a line of p's log.
func waitLog(t *testing.T, p *testkit.Process, want string) {
	t.Helper()
	eventually(t, 30*time.Second, want, func() (bool, string) {
		return strings.Contains(p.Log.String(), want), tail(p.Log.String(), 2000)
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (r *siteRig) addNS(names ...string) {
	for _, n := range names {
		if out, err := exec.Command("ip", "netns", "add", n).CombinedOutput(); err != nil {
			r.t.Fatalf("ip netns add %s: %v\n%s", n, err, out)
		}
		r.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
		r.ip(n, "link", "set", "lo", "up")
	}
}

// veth makes a veth pair between two namespaces, both ends up.
func (r *siteRig) veth(ns1, if1, ns2, if2 string) {
	r.ip(ns1, "link", "add", if1, "type", "veth", "peer", "name", if2, "netns", ns2)
	r.ip(ns1, "link", "set", if1, "up")
	r.ip(ns2, "link", "set", if2, "up")
}

func (r *siteRig) ip(ns string, args ...string) {
	r.t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
		r.t.Fatalf("ip -n %s %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
}

// exec runs a program in a namespace.
func (r *siteRig) exec(ns string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	return string(out), err
}

// inNS runs f on a thread in namespace name: the sockets it opens live there.
func inNS(t *testing.T, name string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			t.Error(err)
			return
		}
		ns, err := vnetns.GetFromName(name)
		if err != nil {
			t.Error(err)
			return
		}
		defer ns.Close()
		if err := vnetns.Set(ns); err != nil {
			t.Error(err)
			return
		}
		f()
		if vnetns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	<-done
}

// serveLetter answers each TCP connection to addr in namespace ns with
// letter and the SHA-256 of what the client sent before closing its side.
func serveLetter(t *testing.T, ns, addr, letter string) {
	var ln net.Listener
	var err error
	inNS(t, ns, func() { ln, err = net.Listen("tcp", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				h := sha256.New()
				_, _ = io.Copy(h, c)
				fmt.Fprintf(c, "%s %x", letter, h.Sum(nil))
			}()
		}
	}()
}

// askLetter sends 1 MiB from namespace ns to addr and returns the
// server's letter, having checked its digest of the data.
func askLetter(t *testing.T, ns, addr string) (string, error) {
	var c net.Conn
	var err error
	inNS(t, ns, func() { c, err = net.DialTimeout("tcp", addr, 5*time.Second) })
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	if _, err := c.Write(data); err != nil {
		return "", err
	}
	_ = c.(*net.TCPConn).CloseWrite()
	answer, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	letter, digest, _ := bytes.Cut(answer, []byte(" "))
	if want := fmt.Sprintf("%x", sha256.Sum256(data)); string(digest) != want {
		return "", fmt.Errorf("the server's digest %q is not the data's %s", digest, want)
	}
	return string(letter), nil
}

// TestSiteTenantsOverlap: two tenants with the same hosted network
// 10.0.0.0/24 and the same office network 192.168.1.0/24; each office
// reaches its own tenant's desktop and never the other's.
func TestSiteTenantsOverlap(t *testing.T) {
	parallel(t)
	r := newSiteRig(t)
	serveLetter(t, r.desk["a"], "10.0.0.10:7000", "A")
	serveLetter(t, r.desk["b"], "10.0.0.10:7000", "B")
	serveLetter(t, r.desk["a"], "[fd00:10::10]:7000", "A")
	serveLetter(t, r.desk["b"], "[fd00:10::10]:7000", "B")
	for _, x := range []string{"a", "b"} {
		if out, err := r.exec(r.officeLAN[x], "busybox", "ping", "-c", "2", "-W", "3", "-I", "192.168.1.10", "10.0.0.10"); err != nil {
			t.Fatalf("office %s pings desktop 10.0.0.10: %v\n%s", x, err, out)
		}
		if out, err := r.exec(r.officeLAN[x], "busybox", "ping", "-c", "2", "-W", "3", "-I", "fd00:192::10", "fd00:10::10"); err != nil {
			t.Fatalf("office %s pings desktop fd00:10::10: %v\n%s", x, err, out)
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
	// A graceful stop removes the devices, and the namespaces deskway
	// created, not the ones it found.
	r.stop(r.officeProc["a"])
	if out, _ := exec.Command("ip", "netns", "list").CombinedOutput(); strings.Contains(string(out), r.officeLAN["a"]) {
		t.Fatalf("office a's router stopped and its network namespace %s is still there:\n%s", r.officeLAN["a"], out)
	}
	r.stop(r.gwProc)
	if out, err := r.exec(r.comp["a"], "ip", "link", "show", "dw-a"); err == nil {
		t.Fatalf("the gateway stopped and its device dw-a is still there:\n%s", out)
	}
	if _, err := r.exec(r.comp["a"], "ip", "link", "show", "hosted"); err != nil {
		t.Fatalf("the gateway stopped and took compartment a, which it had not created, with it: %v", err)
	}
}

// stop ends p with SIGTERM, as systemd does, and waits for it.
func (r *siteRig) stop(p *testkit.Process) {
	r.t.Helper()
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.Cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			r.t.Fatalf("deskway site ended with %v:\n%s", err, tail(p.Log.String(), 3000))
		}
	case <-time.After(20 * time.Second):
		r.t.Fatalf("deskway site did not stop within 20 s of SIGTERM")
	}
}
