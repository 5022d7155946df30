package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/sitebench"
	"github.com/deskway/deskway/internal/testkit"
)

// A gateway of the pair: the tenant's namespace is one the test made,
// attached to the desktops' bridge; the active holds 198.51.100.1 on the
// underlay and 10.0.0.1 in the tenant's namespace.
const siteHAGatewayConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["e2e-admin-token"]}
site:
  underlay:
    addresses: [198.51.100.1]
  ha:
    database: file:%[2]s
    group: pair
    node: %[3]s
    lease: 1s
    addresses:
    - {address: 198.51.100.1/24, interface: ul0}
  tenants:
  - name: a
    key: 1001
    namespace: %[4]s
    prefixes: [10.0.0.0/24]
    inside:
    - {address: 10.0.0.1/24, interface: hosted}
    sites:
    - name: office
      peer: 198.51.100.2
      prefixes: [192.168.1.0/24]
    bgp:
      asn: 65000
      router_id: 10.0.0.1
      listen: [10.0.0.1]
      port: 1179
      peers:
      - address: 10.0.0.10
        asn: 65010
`

// haRig is an office and two gateways on one underlay bridge, and the
// desktops' network bridged to both gateways' tenant namespaces.
type haRig struct {
	*siteRig
	dir             string
	gw, comp, cfg   map[string]string
	proc            map[string]*testkit.Process
	officeNS, lanNS string
	desk            string
}

func newHARig(t *testing.T) *haRig {
	testkit.RequireRoot(t)
	testkit.Require(t, "ip", "nsenter", "curl")
	pg := testkit.StartPostgres(t)
	if _, err := pg.CreateDB(context.Background(), "siteha", ""); err != nil {
		t.Fatal(err)
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	r := &haRig{siteRig: &siteRig{t: t, bin: build(t), sfx: sfx, ul: "dwhu-" + sfx}, dir: t.TempDir(),
		gw: map[string]string{}, comp: map[string]string{}, cfg: map[string]string{}, proc: map[string]*testkit.Process{},
		officeNS: "dwho-" + sfx, lanNS: "dwhl-" + sfx, desk: "dwhd-" + sfx}
	r.addNS(r.ul, r.officeNS, r.desk)
	r.ip(r.ul, "link", "add", "br0", "type", "bridge")
	r.ip(r.ul, "link", "set", "br0", "up")
	r.ip(r.desk, "link", "add", "hbr", "type", "bridge")
	r.ip(r.desk, "link", "set", "hbr", "up")
	r.ip(r.desk, "addr", "add", "10.0.0.10/24", "dev", "hbr")
	r.ip(r.desk, "route", "add", "default", "via", "10.0.0.1")
	r.veth(r.officeNS, "ul0", r.ul, "of0")
	r.ip(r.ul, "link", "set", "of0", "master", "br0")
	r.ip(r.officeNS, "addr", "add", "198.51.100.2/24", "dev", "ul0")
	dsn := filepath.Join(r.dir, "dsn")
	writeFile(t, dsn, pg.SocketDSN("siteha"))
	for i, n := range []string{"gw-1", "gw-2"} {
		r.gw[n], r.comp[n] = fmt.Sprintf("dwh%d-%s", i+1, sfx), fmt.Sprintf("dwhc%d-%s", i+1, sfx)
		r.addNS(r.gw[n], r.comp[n])
		r.veth(r.gw[n], "ul0", r.ul, fmt.Sprintf("g%d0", i+1))
		r.ip(r.ul, "link", "set", fmt.Sprintf("g%d0", i+1), "master", "br0")
		r.ip(r.gw[n], "addr", "add", fmt.Sprintf("198.51.100.%d/24", 11+i), "dev", "ul0")
		r.veth(r.comp[n], "hosted", r.desk, fmt.Sprintf("c%d0", i+1))
		r.ip(r.desk, "link", "set", fmt.Sprintf("c%d0", i+1), "master", "hbr")
		r.cfg[n] = filepath.Join(r.dir, n+".yaml")
		writeFile(t, r.cfg[n], fmt.Sprintf(siteHAGatewayConfig, filepath.Join(r.dir, n+"-state"), dsn, n, r.comp[n]))
	}
	r.start("gw-1")
	waitLog(t, r.proc["gw-1"], `"msg":"took over as the active gateway"`)
	r.start("gw-2")
	waitLog(t, r.proc["gw-2"], `"msg":"high availability: passive, watching the lease"`)
	cfg := filepath.Join(r.dir, "office.yaml")
	writeFile(t, cfg, fmt.Sprintf(siteOfficeConfig, filepath.Join(r.dir, "office-state"), "198.51.100.2", 1001, r.lanNS, "198.51.100.1", false, 1400))
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", r.lanNS).Run() })
	office := testkit.Start(t, nil, "nsenter", "--net=/run/netns/"+r.officeNS, r.bin, "site", "-c", cfg)
	waitLog(t, office, `"msg":"site gateway forwarding"`)
	r.ip(r.lanNS, "addr", "add", "192.168.1.10/32", "dev", "lo")
	return r
}

// start runs gateway n in its underlay namespace.
func (r *haRig) start(n string) {
	r.proc[n] = testkit.Start(r.t, nil, "nsenter", "--net=/run/netns/"+r.gw[n], r.bin, "site", "-c", r.cfg[n])
}

// holds tells whether gateway n's namespaces hold the pair's addresses.
func (r *haRig) holds(n string) (vip, inside bool) {
	a, _ := r.exec(r.gw[n], "ip", "-4", "addr", "show", "dev", "ul0")
	b, _ := r.exec(r.comp[n], "ip", "-4", "addr", "show", "dev", "hosted")
	return strings.Contains(a, "198.51.100.1/24"), strings.Contains(b, "10.0.0.1/24")
}

// speaking tells whether gateway n's BGP speaker listens in its tenant's
// namespace.
func (r *haRig) speaking(n string) bool {
	out, _ := r.exec(r.comp[n], "ss", "-ltnH", "sport = :1179")
	return strings.Contains(out, "10.0.0.1:1179")
}

// mac is the hardware address of interface dev in namespace ns.
func (r *haRig) mac(ns, dev string) string {
	out, err := r.exec(ns, "cat", "/sys/class/net/"+dev+"/address")
	if err != nil {
		r.t.Fatalf("%s's address in %s: %v\n%s", dev, ns, err, out)
	}
	return strings.TrimSpace(out)
}

// movedTo checks, within a second, that the office's neighbour entry for
// the endpoint address and the desktop's for the inside address name
// gateway n's interfaces.
func (r *haRig) movedTo(t *testing.T, n string) {
	t.Helper()
	ul, in := r.mac(r.gw[n], "ul0"), r.mac(r.comp[n], "hosted")
	eventually(t, time.Second, "the neighbours' entries moved to "+n, func() (bool, string) {
		o, _ := r.exec(r.officeNS, "ip", "neigh", "show", "198.51.100.1")
		d, _ := r.exec(r.desk, "ip", "neigh", "show", "10.0.0.1")
		return strings.Contains(o, ul) && strings.Contains(d, in),
			fmt.Sprintf("office: %s (want %s); desktop: %s (want %s)", strings.TrimSpace(o), ul, strings.TrimSpace(d), in)
	})
}

// startPinger probes the desktop from the office's host every 50 ms
// (the site bench's probe) until the test ends.
func startPinger(t *testing.T, ns string) *sitebench.Probe {
	p, err := sitebench.StartProbe(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// firstAnswerAfter waits for the answer to a request sent after since
// and returns when it came.
func firstAnswerAfter(t *testing.T, p *sitebench.Probe, since time.Time, within time.Duration) time.Time {
	t.Helper()
	got, err := p.AnswerAfter(context.Background(), since, within)
	if err != nil {
		t.Fatalf("an answer to a ping sent after the failover began: %v", err)
	}
	return got
}

// stream sends a known byte pattern from the office's host to the
// desktop for d, at about 2 MB/s, and checks the desktop's digest of it;
// it closes midway, if not nil, once 4 MiB are sent.
func stream(t *testing.T, ns, addr string, d time.Duration, midway chan<- struct{}) error {
	var c net.Conn
	var err error
	inNS(t, ns, func() {
		dl := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(192, 168, 1, 10)}}
		c, err = dl.Dial("tcp", addr)
	})
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d + 30*time.Second))
	h := sha256.New()
	chunk := make([]byte, 32<<10)
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		for j := range chunk {
			chunk[j] = byte(i*31 + j)
		}
		h.Write(chunk)
		if _, err := c.Write(chunk); err != nil {
			return fmt.Errorf("after %d bytes: %w", i*len(chunk), err)
		}
		if midway != nil && (i+1)*len(chunk) == 4<<20 {
			close(midway)
		}
		time.Sleep(15 * time.Millisecond)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	answer, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("reading the digest: %w", err)
	}
	if want := fmt.Sprintf("D %x", h.Sum(nil)); string(answer) != want {
		return fmt.Errorf("the desktop's digest %q is not the data's %q", answer, want)
	}
	return nil
}

// TestSiteHAFailover: the active gateway is killed with SIGKILL while
// the office streams TCP to a desktop and pings it: the passive takes the
// addresses over within 3 s, the killed one's addresses go by themselves,
// and the stream ends with every byte right. Then the new active is
// stopped with SIGTERM and the restarted first gateway takes back over,
// told by the lease's release rather than its expiry.
func TestSiteHAFailover(t *testing.T) {
	r := newHARig(t)
	serveLetter(t, r.desk, "10.0.0.10:7000", "D")
	if v, i := r.holds("gw-1"); !v || !i {
		t.Fatalf("the active gw-1 holds the endpoint address: %v, the inside address: %v", v, i)
	}
	if v, i := r.holds("gw-2"); v || i {
		t.Fatalf("the passive gw-2 holds the endpoint address: %v, the inside address: %v", v, i)
	}
	eventually(t, 10*time.Second, "gw-1's BGP speaker listening", func() (bool, string) { return r.speaking("gw-1"), "" })
	if r.speaking("gw-2") {
		t.Fatal("the passive gw-2's BGP speaker listens")
	}
	p := startPinger(t, r.lanNS)
	firstAnswerAfter(t, p, time.Now(), 10*time.Second)
	streamErr := make(chan error, 1)
	midway := make(chan struct{})
	go func() { streamErr <- stream(t, r.lanNS, "10.0.0.10:7000", 10*time.Second, midway) }()
	select {
	case <-midway:
	case err := <-streamErr:
		t.Fatalf("the TCP stream ended before the failover: %v", err)
	}

	killed := time.Now()
	if err := r.proc["gw-1"].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = r.proc["gw-1"].Cmd.Wait()
	back := firstAnswerAfter(t, p, killed, 10*time.Second)
	failover := back.Sub(killed)
	t.Logf("kill -9 of the active to the first ping answered: %v", failover.Round(time.Millisecond))
	if failover > 3*time.Second {
		t.Errorf("the desktop answered %v after the active was killed; want within 3 s", failover.Round(time.Millisecond))
	}
	waitLog(t, r.proc["gw-2"], `gw-1's lease expired`)
	// The neighbours have the new active's hardware addresses. (Here they
	// also learn them from the new active's own traffic within a couple
	// of seconds, so TestSiteGratuitousARP checks the announcement alone.)
	r.movedTo(t, "gw-2")
	// The killed gateway's addresses end with their lifetime (2 s, the
	// kernel's timer rounding up to a second).
	eventually(t, 5*time.Second, "the killed gateway's addresses gone by themselves", func() (bool, string) {
		v, i := r.holds("gw-1")
		return !v && !i, fmt.Sprintf("endpoint address held: %v, inside address held: %v", v, i)
	})
	eventually(t, 10*time.Second, "gw-2's BGP speaker listening", func() (bool, string) { return r.speaking("gw-2"), "" })
	if err := <-streamErr; err != nil {
		t.Fatalf("the TCP stream across the failover: %v", err)
	}
	out, err := r.exec(r.gw["gw-2"], "curl", "-sfk", "https://127.0.0.1:9443/metrics")
	if err != nil || !strings.Contains(out, "deskway_site_ha_active 1") || !strings.Contains(out, `deskway_site_ha_transitions_total{to="active"} 1`) {
		t.Fatalf("gw-2's metrics after taking over (%v):\n%s", err, grepLines(out, "deskway_site_ha"))
	}
	tunnels, err := r.exec(r.gw["gw-2"], r.bin, "site", "tunnels", "-c", r.cfg["gw-2"])
	if err != nil || !strings.Contains(tunnels, "gw-2: active of pair pair") {
		t.Fatalf("deskway site tunnels on gw-2 (%v):\n%s", err, tunnels)
	}
	t.Logf("deskway site tunnels on gw-2:\n%s", tunnels)

	// The first gateway comes back as the passive one, and takes over
	// again when the second is stopped.
	r.start("gw-1")
	waitLog(t, r.proc["gw-1"], `"msg":"high availability: passive, watching the lease"`)
	stopped := time.Now()
	r.stop(r.proc["gw-2"])
	waitLog(t, r.proc["gw-1"], `gw-2 released the lease (it stopped)`)
	// The stopping gateway answers until it gives its addresses up: the
	// handover is the longest silence after the signal.
	firstAnswerAfter(t, p, time.Now(), 10*time.Second)
	gap := p.LongestGap(stopped)
	t.Logf("SIGTERM of the active: the longest time without a ping answered was %v", gap.Round(time.Millisecond))
	if gap > 3*time.Second {
		t.Errorf("the handover on SIGTERM left %v without a ping answered; want under 3 s", gap.Round(time.Millisecond))
	}
	if v, i := r.holds("gw-2"); v || i {
		t.Fatalf("the stopped gw-2 still holds the endpoint address: %v, the inside address: %v", v, i)
	}
	eventually(t, 10*time.Second, "gw-1's BGP speaker listening again", func() (bool, string) { return r.speaking("gw-1"), "" })
	if err := stream(t, r.lanNS, "10.0.0.10:7000", time.Second, nil); err != nil {
		t.Fatalf("TCP through gw-1 after it took back over: %v", err)
	}
}
