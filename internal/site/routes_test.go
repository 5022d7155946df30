package site

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
)

// TestLearn: prefixes a route source learnt behind a site are routed to
// the tenant's device in its namespace and accepted as the site's
// sources; replacing them removes the old routes; one over the tenant's
// hosted network is refused. The namespace is deskway's own (created
// by up, deleted by down).
func TestLearn(t *testing.T) {
	ns := testNamespace(t, "dwsr")
	tn, err := newTenant(&config.Tenant{Name: "a", Key: 7, Namespace: ns, Interface: "dw-a", MTU: 1400, Prefixes: []string{"10.0.0.0/24"},
		Sites: []config.TenantSite{{Name: "office", Peer: "198.51.100.2", Prefixes: []string{"192.168.1.0/24"}}}}, newMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	if created, err := tn.up(); err != nil || !created {
		t.Fatalf("up: created %v, %v", created, err)
	}
	routes := func() string {
		out, err := exec.Command("ip", "-n", ns, "route", "show", "dev", "dw-a").CombinedOutput()
		if err != nil {
			t.Fatalf("ip route: %v\n%s", err, out)
		}
		return string(out)
	}
	office := tn.c().sites[0]
	at := func(s string) (string, bool) {
		st, ok := tn.routes.Load().Lookup(netip.MustParseAddr(s))
		if !ok {
			return "", false
		}
		return st.name, office.owns(netip.MustParseAddr(s))
	}
	if err := tn.learn("office", []netip.Prefix{netip.MustParsePrefix("172.16.0.0/16"), netip.MustParsePrefix("10.0.0.128/25")}); err == nil || !strings.Contains(err.Error(), "10.0.0.128/25: overlaps the tenant's hosted network 10.0.0.0/24") {
		t.Fatalf("learning over the hosted network: %v", err)
	}
	if r := routes(); !strings.Contains(r, "172.16.0.0/16") || !strings.Contains(r, "192.168.1.0/24") || strings.Contains(r, "10.0.0.128") {
		t.Fatalf("routes after learning 172.16.0.0/16:\n%s", r)
	}
	if name, owned := at("172.16.9.9"); name != "office" || !owned {
		t.Fatalf("172.16.9.9 goes to %q (owned %v), want office", name, owned)
	}
	if err := tn.learn("office", []netip.Prefix{netip.MustParsePrefix("172.17.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	if r := routes(); strings.Contains(r, "172.16.0.0/16") || !strings.Contains(r, "172.17.0.0/16") {
		t.Fatalf("routes after replacing with 172.17.0.0/16:\n%s", r)
	}
	if _, ok := at("172.16.9.9"); ok {
		t.Fatal("172.16.9.9 still routed after the prefix was withdrawn")
	}
	if deleted, err := tn.down(); err != nil || !deleted {
		t.Fatalf("down: deleted %v, %v", deleted, err)
	}
	if out, _ := exec.Command("ip", "netns", "list").CombinedOutput(); strings.Contains(string(out), ns) {
		t.Fatalf("namespace %s outlived down", ns)
	}
	if err := tn.learn("office", nil); err == nil {
		t.Fatal("learnt on a tenant that is down")
	}
}

// TestDeviceEventsDrained: the device's up, down and MTU events are
// read, so that its listener, which blocks on a full channel, ends
// when the device is closed instead of leaking.
func TestDeviceEventsDrained(t *testing.T) {
	ns := testNamespace(t, "dwse")
	before := runtime.NumGoroutine()
	tn, err := newTenant(&config.Tenant{Name: "a", Key: 7, Namespace: ns, Interface: "dw-a", MTU: 1400,
		Sites: []config.TenantSite{{Name: "office", Peer: "198.51.100.2", Prefixes: []string{"192.168.1.0/24"}}}}, newMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tn.up(); err != nil {
		t.Fatal(err)
	}
	for mtu := 1300; mtu < 1310; mtu++ {
		if out, err := exec.Command("ip", "-n", ns, "link", "set", "dw-a", "mtu", strconv.Itoa(mtu)).CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	if _, err := tn.down(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines after down, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testNamespace names a network namespace for one test (prefix and a
// random suffix, so parallel runs never share one) and deletes it when the
// test ends; creating it needs root, which CI has, so there it fails
// rather than skips.
func testNamespace(t *testing.T, prefix string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("this test creates a network namespace and must run as root")
		}
		t.Skip("needs root to create a network namespace")
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	ns := prefix + "-" + hex.EncodeToString(b[:])
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	return ns
}
