package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/testkit"
)

// TestNetbootAnswersRouterSolicitations: iPXE waits for an IPv6 router
// as well as for DHCP before it boots. On a boot network of deskway's own
// (dhcp: full) deskway answers router solicitations with an advertisement
// that offers nothing and names no default router; a flood of
// solicitations gets at most one answer a second; a proxyDHCP server,
// whose network has its own routers, stays silent unless told otherwise.
// The solicitations come from Debian's rdisc6 on the far end of a veth
// pair on the boot network's bridge.
func TestNetbootAnswersRouterSolicitations(t *testing.T) {
	parallel(t)
	testkit.Require(t, "rdisc6")
	start := func(t *testing.T, mode string) (*netns, *testkit.Process) {
		ns := newNetns(t)
		ns.run("ip", "link", "add", "cli0", "type", "veth", "peer", "name", "brp0")
		ns.run("ip", "link", "set", "brp0", "master", "br0", "up")
		ns.run("ip", "link", "set", "cli0", "up")
		dir := t.TempDir()
		base := filepath.Join(dir, "golden.img")
		os.WriteFile(base, nil, 0o600)
		os.Truncate(base, 16<<20)
		cfg := strings.Replace(netbootConfig, "    dhcp: full\n    pool: {start: 10.77.0.100, end: 10.77.0.150}\n", mode, 1)
		cfg = strings.Replace(cfg, "kernel: %[4]s, initrd: %[5]s, ", "", 1)
		path := filepath.Join(dir, "deskway.yaml")
		os.WriteFile(path, []byte(fmt.Sprintf(cfg, filepath.Join(dir, "state"), testkit.FreePort(t), base)), 0o600)
		srv := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, build(t), "run", "-c", path)
		for deadline := time.Now().Add(15 * time.Second); !strings.Contains(srv.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the boot services did not start:\n%s", srv.Log.String())
			}
		}
		// The bridge's link-local address is usable once its duplicate
		// address detection is over.
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			out := ns.run("ip", "-6", "addr", "show", "dev", "br0")
			if strings.Contains(out, "fe80::") && !strings.Contains(out, "tentative") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("br0 has no link-local address:\n%s", out)
			}
		}
		return ns, srv
	}
	solicit := func(ns *netns) (string, error) {
		// A new interface's link-local address is tentative until duplicate
		// address detection ends; rdisc6 cannot send from it before.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			out, _ := exec.Command("ip", "netns", "exec", ns.name, "ip", "-6", "addr", "show", "dev", "cli0", "scope", "link").Output()
			if strings.Contains(string(out), "fe80") && !strings.Contains(string(out), "tentative") {
				break
			}
		}
		out, err := exec.Command("ip", "netns", "exec", ns.name, "rdisc6", "-1", "-n", "-w", "1500", "-r", "4", "cli0").CombinedOutput()
		return string(out), err
	}
	field := func(out, name string) string {
		m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(name) + `\s*:\s*(.*?)\s*$`).FindStringSubmatch(out)
		if m == nil {
			return ""
		}
		return m[1]
	}
	t.Run("full", func(t *testing.T) {
		ns, srv := start(t, "    dhcp: full\n    pool: {start: 10.77.0.100, end: 10.77.0.150}\n")
		out, err := solicit(ns)
		if err != nil {
			t.Fatalf("no router advertisement from deskway: %v\n%s\n%s", err, out, lastLines(srv.Log.String(), 20))
		}
		for name, want := range map[string]string{
			"Stateful address conf.": "No", "Stateful other conf.": "No",
			"Router lifetime": "0 (0x00000000) seconds",
		} {
			if got := field(out, name); got != want {
				t.Errorf("%s: %q, want %q\n%s", name, got, want, out)
			}
		}
		if strings.Contains(out, "Prefix") || !regexp.MustCompile(`from fe80::`).MatchString(out) {
			t.Errorf("the advertisement offers a prefix or is not from a link-local address:\n%s", out)
		}
		// A flood: eight clients solicit at once, twice over, while a
		// ninth only listens. Every soliciting client is answered, and
		// the listener hears at most one advertisement a second.
		listen := exec.Command("ip", "netns", "exec", ns.name, "rdisc6", "-d", "-m", "-n", "-w", "4000", "cli0")
		var heard lockedBuffer
		listen.Stdout, listen.Stderr = &heard, &heard
		if err := listen.Start(); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		var wg sync.WaitGroup
		errs := make(chan string, 16)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if out, err := solicit(ns); err != nil {
					errs <- fmt.Sprintf("%v: %s", err, out)
				}
			}()
		}
		wg.Wait()
		_ = listen.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("a soliciting client got no answer: %s", e)
		}
		n := strings.Count(heard.String(), "Router lifetime")
		if limit := int(time.Since(began)/time.Second) + 1; n == 0 || n > limit {
			t.Fatalf("the listener heard %d advertisements in %s (at most one a second wanted):\n%s", n, time.Since(began).Round(time.Millisecond), heard.String())
		}
	})
	t.Run("another router", func(t *testing.T) {
		ns, srv := start(t, "    dhcp: full\n    pool: {start: 10.77.0.100, end: 10.77.0.150}\n")
		if out, err := solicit(ns); err != nil {
			t.Fatalf("no answer before another router spoke: %v\n%s", err, out)
		}
		// A router on the boot network advertises itself: deskway falls
		// silent rather than contradict it.
		advertiseFrom(t, ns, "cli0", &ndp.RouterAdvertisement{RouterLifetime: 30 * time.Minute})
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(srv.Log.String(), "another IPv6 router advertises"); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("deskway did not hear the other router:\n%s", lastLines(srv.Log.String(), 10))
			}
		}
		if out, err := solicit(ns); err == nil {
			t.Fatalf("deskway answered beside another router:\n%s", out)
		}
	})
	t.Run("proxy", func(t *testing.T) {
		ns, _ := start(t, "    dhcp: proxy\n")
		if out, err := solicit(ns); err == nil {
			t.Fatalf("a proxyDHCP server answered a router solicitation by default:\n%s", out)
		}
	})
	t.Run("proxy turned on", func(t *testing.T) {
		ns, _ := start(t, "    dhcp: proxy\n    router_advertisements: true\n")
		if out, err := solicit(ns); err != nil || field(out, "Router lifetime") != "0 (0x00000000) seconds" {
			t.Fatalf("router_advertisements: true gave no answer: %v\n%s", err, out)
		}
	})
}

// advertiseFrom sends one router advertisement out of ifname in the
// network namespace ns, from a thread that enters the namespace and is
// thrown away after.
func advertiseFrom(t *testing.T, ns *netns, ifname string, ra *ndp.RouterAdvertisement) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, err := os.Open("/run/netns/" + ns.name)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			errc <- err
			return
		}
		c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		errc <- c.WriteTo(ra, nil, netip.IPv6LinkLocalAllNodes())
	}()
	if err := <-errc; err != nil {
		t.Fatalf("advertising from %s: %v", ifname, err)
	}
}
