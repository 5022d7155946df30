package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// officeB2Site is a second office of tenant b, 192.168.2.0/24 behind
// a router at 198.51.100.5.
const officeB2Site = `    - name: office-b2
      peer: 198.51.100.5
      prefixes: [192.168.2.0/24]
`

// tenantC is a third tenant, with the same networks as a and b.
const tenantC = `  - name: c
    key: 1003
    namespace: %s
    prefixes: [10.0.0.0/24, "fd00:10::/64"]
    sites:
    - name: office-c
      peer: 198.51.100.4
      prefixes: [192.168.1.0/24, "fd00:192::/64"]
`

// officeBSite is tenant b's office as siteGatewayConfig has it.
const officeBSite = `    - name: office-b
      peer: "2001:db8:100::3"
      prefixes: [192.168.1.0/24, "fd00:192::/64"]
`

// officeStream is a TCP connection from an office to a desktop that sends
// until it is told to stop, then checks the server's digest of it all.
type officeStream struct {
	c    net.Conn
	sum  [32]byte
	stop chan struct{}
	done chan error
}

func startOfficeStream(t *testing.T, ns, addr string) *officeStream {
	var c net.Conn
	var err error
	inNS(t, ns, func() { c, err = net.DialTimeout("tcp", addr, 5*time.Second) })
	if err != nil {
		t.Fatalf("stream to %s: %v", addr, err)
	}
	s := &officeStream{c: c, stop: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		h := sha256.New()
		buf := make([]byte, 32<<10)
		for {
			select {
			case <-s.stop:
				copy(s.sum[:], h.Sum(nil))
				s.done <- c.(*net.TCPConn).CloseWrite()
				return
			default:
			}
			_, _ = rand.Read(buf)
			_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(buf); err != nil {
				s.done <- err
				return
			}
			h.Write(buf)
		}
	}()
	return s
}

// finish stops sending and checks the server's letter and digest.
func (s *officeStream) finish(t *testing.T, letter string) {
	t.Helper()
	defer s.c.Close()
	close(s.stop)
	if err := <-s.done; err != nil {
		t.Fatalf("the stream broke: %v", err)
	}
	_ = s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, err := io.ReadAll(s.c)
	if err != nil {
		t.Fatalf("the stream's answer: %v", err)
	}
	got, digest, _ := bytes.Cut(answer, []byte(" "))
	if string(got) != letter || string(digest) != fmt.Sprintf("%x", s.sum) {
		t.Fatalf("the stream's answer %q, want %s %x", answer, letter, s.sum)
	}
}

// reload sends the gateway SIGHUP with body as its file and waits for
// the n-th line of the log saying what happened.
func (r *siteRig) reload(body, want string, n int) {
	r.t.Helper()
	writeFile(r.t, r.gwCfg, body)
	if err := syscall.Kill(r.gwProc.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
		r.t.Fatal(err)
	}
	eventually(r.t, 30*time.Second, want, func() (bool, string) {
		return strings.Count(r.gwProc.Log.String(), want) >= n, tail(r.gwProc.Log.String(), 3000)
	})
}

// TestSiteReload: SIGHUP puts a changed site section in force without
// touching what did not change. A TCP stream through tenant a runs
// across a reload that adds tenant c, changes office b's prefixes and
// removes office b2 (added by an earlier reload): the stream ends with
// every byte and a's counters go on; c's office reaches c's desktop;
// b2 is cut off, its packets dropped and counted; b's office keeps the
// prefix it still has and loses the other. A file with a mistake, and
// one changing what takes a restart, change nothing and say why. Every
// change is in the audit trail.
func TestSiteReload(t *testing.T) {
	parallel(t)
	r := newSiteRig(t)
	base, err := os.ReadFile(r.gwCfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []string{"a", "b", "c"} {
		r.underlay[x] = map[string]string{"a": "198.51.100.2", "b": "2001:db8:100::3", "c": "198.51.100.4"}[x]
	}
	r.officeUL["c"] = "198.51.100.4/24"
	r.addTenantNets("c")
	for x, l := range map[string]string{"a": "A", "b": "B", "c": "C"} {
		serveLetter(t, r.desk[x], "10.0.0.10:7000", l)
	}
	dir := t.TempDir()
	officeConfig := func(x, ul string, key int, prefixes string) string {
		body := fmt.Sprintf(siteOfficeConfig, filepath.Join(dir, x), ul, key, r.officeLAN[x], "198.51.100.1", false, 1400)
		return strings.Replace(body, `prefixes: [192.168.1.0/24, "fd00:192::/64"]`, prefixes, 1)
	}
	// Office b2: a router on the underlay, 192.168.2.10 behind it.
	r.office["b2"], r.officeLAN["b2"] = "dwsob2-"+r.sfx, "dwslb2-"+r.sfx
	r.addNS(r.office["b2"])
	r.veth(r.office["b2"], "ul0", r.ul, "ob20")
	r.ip(r.ul, "link", "set", "ob20", "master", "br0")
	r.ip(r.office["b2"], "addr", "add", "198.51.100.5/24", "dev", "ul0")
	// Tenant b (sequence numbers, checksums) is the gateway's userspace
	// datapath's, and so is b2's router: over veths alone a kernel
	// datapath's superpacket would reach the gateway's raw socket
	// unsegmented with its inner checksum left to an offload that never
	// comes (docs/site.md, "The datapath").
	b2 := strings.Replace(officeConfig("b2", "198.51.100.5", 1002, "prefixes: [192.168.2.0/24]"), "site:\n", "site:\n  datapath: userspace\n", 1)
	r.startOffice("b2", b2, "192.168.2.10/32")
	r.startOffice("c", officeConfig("c", "198.51.100.4", 1003, `prefixes: [192.168.1.0/24, "fd00:192::/64"]`))

	// Reload 1: office b2 added to tenant b.
	withB2 := string(base) + officeB2Site
	r.reload(withB2, "configuration reloaded", 1)
	if got, err := askLetter(t, r.officeLAN["b2"], "10.0.0.10:7000"); err != nil || got != "B" {
		t.Fatalf("office b2, added by a reload, to b's desktop: %q, %v", got, err)
	}

	// Reload 2 with a stream running through tenant a.
	s := startOfficeStream(t, r.officeLAN["a"], "10.0.0.10:7000")
	inA := `deskway_site_packets_total{direction="in",tenant="a"}`
	eventually(t, 10*time.Second, "the stream flows", func() (bool, string) {
		n := r.metric(inA)
		return n > 100, fmt.Sprint(n)
	})
	before := r.metric(inA)
	next := strings.Replace(string(base), officeBSite, strings.Replace(officeBSite, `, "fd00:192::/64"`, "", 1), 1) +
		fmt.Sprintf(tenantC, r.comp["c"])
	if next == string(base)+fmt.Sprintf(tenantC, r.comp["c"]) {
		t.Fatal("the test's edit of office b's prefixes did not apply")
	}
	r.reload(next, "configuration reloaded", 2)
	if got, err := askLetter(t, r.officeLAN["c"], "10.0.0.10:7000"); err != nil || got != "C" {
		t.Fatalf("office c, added by a reload, to c's desktop: %q, %v", got, err)
	}
	s.finish(t, "A")
	if after := r.metric(inA); after < before {
		t.Fatalf("tenant a's packets in went from %v to %v across the reload", before, after)
	}

	// Office b keeps 192.168.1.0/24 and loses fd00:192::/64.
	if got, err := askLetter(t, r.officeLAN["b"], "10.0.0.10:7000"); err != nil || got != "B" {
		t.Fatalf("office b after its prefixes changed: %q, %v", got, err)
	}
	if out, _ := r.exec(r.comp["b"], "ip", "-6", "route", "show", "fd00:192::/64"); strings.TrimSpace(out) != "" {
		t.Fatalf("the route to fd00:192::/64, no longer office b's, is still there: %s", out)
	}
	// Office b2 is cut off: no route to it, its packets dropped.
	if out, _ := r.exec(r.comp["b"], "ip", "route", "show", "192.168.2.0/24"); strings.TrimSpace(out) != "" {
		t.Fatalf("the route to removed office b2 is still there: %s", out)
	}
	notPeer := `deskway_site_drops_total{cause="not_peer",tenant="b"}`
	dropped := r.metric(notPeer)
	if out, err := r.exec(r.officeLAN["b2"], "busybox", "ping", "-c", "2", "-W", "1", "-I", "192.168.2.10", "10.0.0.10"); err == nil {
		t.Fatalf("removed office b2 still reaches b's desktop:\n%s", out)
	}
	eventually(t, 5*time.Second, "office b2's packets counted as dropped", func() (bool, string) {
		n := r.metric(notPeer)
		return n >= dropped+2, fmt.Sprint(dropped, " then ", n)
	})

	// A mistake (tenant c with a's key) and a change that takes a
	// restart (a's namespace): refused with the key, nothing changed.
	bad := strings.Replace(next, "key: 1003", "key: 1001", 1)
	r.reload(bad, "configuration reload refused", 1)
	if log := r.gwProc.Log.String(); !strings.Contains(log, "site.tenants[2].key (line") {
		t.Fatalf("the refusal does not name the key and line:\n%s", tail(log, 3000))
	}
	r.reload(strings.Replace(next, "namespace: "+r.comp["a"], "namespace: dwsother-"+r.sfx, 1), "configuration reload refused", 2)
	if log := r.gwProc.Log.String(); !strings.Contains(log, "site.tenants[0].namespace of tenant a changes only at a restart") {
		t.Fatalf("the refusal does not name the namespace:\n%s", tail(log, 3000))
	}
	if got, err := askLetter(t, r.officeLAN["c"], "10.0.0.10:7000"); err != nil || got != "C" {
		t.Fatalf("office c after the refused reloads: %q, %v", got, err)
	}
	if got, err := askLetter(t, r.officeLAN["a"], "10.0.0.10:7000"); err != nil || got != "A" {
		t.Fatalf("office a after the refused reloads: %q, %v", got, err)
	}

	// The admin API's reload does the same, as the admin token's: office
	// b gets fd00:192::/64 back.
	writeFile(t, r.gwCfg, string(base)+fmt.Sprintf(tenantC, r.comp["c"]))
	if out, err := r.exec(r.gw, "curl", "-skf", "-X", "POST", "-H", "Authorization: Bearer e2e-admin-token", "https://127.0.0.1:9443/api/v1/reload"); err != nil {
		t.Fatalf("POST /api/v1/reload: %v\n%s", err, out)
	}
	if out, err := r.exec(r.officeLAN["b"], "busybox", "ping", "-c", "1", "-W", "3", "-I", "fd00:192::10", "fd00:10::10"); err != nil {
		t.Fatalf("office b over IPv6 after the admin API's reload gave it fd00:192::/64 back: %v\n%s", err, out)
	}
	// The audit trail, as GET /api/v1/audit gives it.
	out, err := r.exec(r.gw, "curl", "-sk", "-H", "Authorization: Bearer e2e-admin-token", "https://127.0.0.1:9443/api/v1/audit?limit=100")
	if err != nil {
		t.Fatalf("GET /api/v1/audit: %v\n%s", err, out)
	}
	var trail struct {
		Entries []struct{ Actor, Action, Source string }
	}
	if err := json.Unmarshal([]byte(out), &trail); err != nil {
		t.Fatalf("GET /api/v1/audit: %v\n%s", err, out)
	}
	var lines []string
	for _, e := range trail.Entries {
		lines = append(lines, e.Actor+" | "+e.Action)
	}
	all := strings.Join(lines, "\n")
	for _, want := range []string{
		"deskway site | site gateway started, tenants a, b",
		"reload (SIGHUP) | site: tenant b: site office-b2 added (peer 198.51.100.5, prefixes 192.168.2.0/24)",
		"reload (SIGHUP) | site: tenant b: site office-b changed (peer 2001:db8:100::3, prefixes 192.168.1.0/24; were peer 2001:db8:100::3, prefixes 192.168.1.0/24, fd00:192::/64)",
		"reload (SIGHUP) | site: tenant b: site office-b2 removed",
		"reload (SIGHUP) | site: tenant c added",
		"reload (SIGHUP) | site reload refused: site.tenants[0].namespace",
		"admin token 1 | site: tenant b: site office-b changed (peer 2001:db8:100::3, prefixes 192.168.1.0/24, fd00:192::/64; were",
		"admin token 1 | POST /api/v1/reload",
	} {
		if !strings.Contains(all, want) {
			t.Fatalf("the audit trail has no %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "site: tenant a") {
		t.Fatalf("the audit trail has a change of tenant a, which did not change:\n%s", all)
	}
	r.stop(r.gwProc)
	if !strings.Contains(r.gwProc.Log.String(), `"action":"site gateway stopped"`) {
		t.Fatalf("the stop is not audited:\n%s", tail(r.gwProc.Log.String(), 2000))
	}
	if out, err := r.exec(r.comp["c"], "ip", "link", "show", "dw-c"); err == nil {
		t.Fatalf("the gateway stopped and tenant c's device, added by a reload, is still there:\n%s", out)
	}
}
