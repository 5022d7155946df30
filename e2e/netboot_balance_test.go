package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// TestNetbootBalancesStreamServers: two deskway stream servers share a
// store with a third that runs the boot services and lists them; server
// A, listed first, serves two clients (qemu-io holding an NBD connection
// each), server B none. Once A has reported them, the boot script a
// device gets lists B first. B is then killed (kill -9, so its report stays behind and goes stale): the next
// script lists A first again, B kept last for failover.
func TestNetbootBalancesStreamServers(t *testing.T) {
	parallel(t)
	ns := newNetns(t)
	testkit.Require(t, "qemu-io")
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	os.WriteFile(base, nil, 0o600)
	os.Truncate(base, 16<<20)
	kernel := filepath.Join(dir, "vmlinuz")
	os.WriteFile(kernel, []byte("kernel"), 0o644)
	store := filepath.Join(dir, "store")
	start := func(i, port int, netboot string) *testkit.Process {
		cfg := filepath.Join(dir, fmt.Sprintf("node%d.yaml", i))
		os.WriteFile(cfg, []byte(fmt.Sprintf(netbootHAConfig, filepath.Join(dir, fmt.Sprintf("state%d", i)), testkit.FreePort(t), port, store, base, kernel, kernel)+netboot), 0o600)
		p := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
		for deadline := time.Now().Add(15 * time.Second); !strings.Contains(p.Log.String(), "stream listening"); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("stream server %d did not start:\n%s", i, p.Log.String())
			}
		}
		return p
	}
	start(0, 10809, "")
	b := start(1, 10810, "")
	n := start(2, 10811, `  netboot:
    interface: br0
    address: 10.77.0.1
    dhcp: proxy
    servers: ["10.77.0.1:10809", "10.77.0.1:10810"]
`)
	cfg := filepath.Join(dir, "node2.yaml")
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(n.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the boot services did not start:\n%s", n.Log.String())
		}
	}
	ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden", "-c", cfg)

	// A's two clients, connected until the test ends.
	for _, c := range []string{"c1", "c2"} {
		cmd := exec.Command("ip", "netns", "exec", ns.name, "qemu-io", "-r", "-f", "raw", "nbd://10.77.0.1:10809/golden/"+c+"/b1")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	// reported is the clients of the server at addr in its report.
	reported := func(addr string) (int, time.Time) {
		fs, _ := filepath.Glob(filepath.Join(store, "servers", "*.json"))
		for _, f := range fs {
			var r struct {
				Addresses []string
				Clients   int
				At        time.Time
			}
			if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &r) == nil && strings.Join(r.Addresses, ",") == addr {
				return r.Clients, r.At
			}
		}
		return -1, time.Time{}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		a, _ := reported("10.77.0.1:10809")
		b, _ := reported("10.77.0.1:10810")
		if a == 2 && b == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the servers report %d and %d clients, want 2 and 0", a, b)
		}
	}
	servers := regexp.MustCompile(`deskway\.servers=(\S+)`)
	script := func() string {
		t.Helper()
		out := ns.run("busybox", "wget", "-qO-", "http://10.77.0.1:8069/netboot/device?mac=52:54:00:77:00:01")
		m := servers.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no server list in pc1's script:\n%s", out)
		}
		return m[1]
	}
	if got := script(); got != "10.77.0.1:10810,10.77.0.1:10809" {
		t.Fatalf("with A serving 2 clients and B none, pc1's servers are %s: want B first", got)
	}

	if err := syscall.Kill(-b.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// B's report stays as the kill left it; once it is stale, B is dead.
	_, at := reported("10.77.0.1:10810")
	if at.IsZero() {
		t.Fatal("B's report is gone after kill -9: the test would not see a stale one")
	}
	for time.Since(at) < 7*time.Second {
		time.Sleep(time.Until(at.Add(7 * time.Second)))
	}
	if got := script(); got != "10.77.0.1:10809,10.77.0.1:10810" {
		t.Fatalf("with B killed, pc1's servers are %s: want A first, B last", got)
	}
}
