package e2e

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

const netbootHAConfig = `state_dir: %[1]s
log: {level: info, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
stream:
  listen: "10.77.0.1:%[3]d"
  tls: "off"
  clients: open
  store: %[4]s
  shared_cache: true
  vdisks:
  - {name: golden, base: %[5]s, kernel: %[6]s, initrd: %[7]s, cmdline: "console=ttyS0 panic=-1 quiet"}
`

// TestNetbootRootSurvivesServerLoss: a network-booted machine runs from
// the first of two stream servers that share a store; that server is
// killed while the machine writes; the machine's root disk moves to the
// second server with its write cache and goes on: what it wrote before
// the loss is read back from the second server, what it writes after
// lands there, and no I/O failed on the way (the kernel logs none). With
// the first server still down, the machine's next power-on boots from the
// second.
func TestNetbootRootSurvivesServerLoss(t *testing.T) {
	guestTest(t)
	ns := newNetns(t, "tap1")
	kernel, initrd := netbootRootKit(t)
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	vdiskWithInit(t, base, nil, `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
echo "before the loss" > /before.txt
sync
( i=0; while [ ! -e /stop ]; do i=$((i+1)); echo "line $i" >> /lines.txt; sync; sleep 0.2; done ) &
sleep 1
echo "DESKWAY writing"
read -r word
sleep 2
touch /stop
wait
echo "after the loss" > /after.txt
sync
echo 3 > /proc/sys/vm/drop_caches
echo "DESKWAY read: $(cat /before.txt) / $(cat /after.txt) / $(wc -l < /lines.txt) lines, last $(tail -n 1 /lines.txt)"
poweroff -f
`)
	store := filepath.Join(dir, "store")
	start := func(i, port int, netboot string) (*testkit.Process, string) {
		cfg := filepath.Join(dir, fmt.Sprintf("node%d.yaml", i))
		os.WriteFile(cfg, []byte(fmt.Sprintf(netbootHAConfig, filepath.Join(dir, fmt.Sprintf("state%d", i)), testkit.FreePort(t), port, store, base, kernel, initrd)+netboot), 0o600)
		p := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
		for deadline := time.Now().Add(15 * time.Second); !strings.Contains(p.Log.String(), "stream listening"); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("stream server %d did not start:\n%s", i, p.Log.String())
			}
		}
		return p, cfg
	}
	first, _ := start(0, 10809, "")
	second, cfg := start(1, 10810, `  netboot:
    interface: br0
    address: 10.77.0.1
    dhcp: full
    pool: {start: 10.77.0.100, end: 10.77.0.150}
    servers: ["10.77.0.1:10809", "10.77.0.1:10810"]
`)
	ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden", "-c", cfg)
	guests(t, 1)
	pc1 := ns.bootVM("tap1", "52:54:00:77:00:01")
	pc1.wait(t, regexp.MustCompile(`deskway: root disk golden/pc1/[0-9a-f]{16} from 10\.77\.0\.1:10809 `), 4*time.Minute)
	pc1.wait(t, regexp.MustCompile(`DESKWAY writing`), time.Minute)

	if err := syscall.Kill(-first.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	pc1.wait(t, regexp.MustCompile(`deskway: root disk golden/pc1/[0-9a-f]{16} from 10\.77\.0\.1:10810 `), 2*time.Minute)
	io.WriteString(pc1.in, "go\n")
	got := pc1.wait(t, regexp.MustCompile(`DESKWAY read: ([^\r\n]*)[\r\n]`), 3*time.Minute)[1]
	if !regexp.MustCompile(`^before the loss / after the loss / (\d+) lines, last line (\d+)$`).MatchString(got) {
		t.Fatalf("the machine read back %q after its server was lost:\n%s\nsecond server:\n%s", got, lastLines(pc1.out.String(), 40), lastLines(second.Log.String(), 20))
	}
	// One reconnection, taken by the kernel at the first try.
	if n := strings.Count(pc1.out.String(), "deskway: root disk connection to 10.77.0.1:10809 lost"); n != 1 || strings.Contains(pc1.out.String(), "connection to 10.77.0.1:10810 lost") {
		t.Fatalf("the root disk was reconnected %d times, once expected:\n%s", n, lastLines(pc1.out.String(), 30))
	}
	m := regexp.MustCompile(`(\d+) lines, last line (\d+)$`).FindStringSubmatch(got)
	if m[1] != m[2] {
		t.Fatalf("lines.txt has %s lines but its last is line %s: a write was lost or doubled", m[1], m[2])
	}
	for _, bad := range []string{"I/O error", "EXT4-fs error", "Buffer I/O", "Remounting filesystem read-only", "did not take the new connection"} {
		if strings.Contains(pc1.out.String(), bad) {
			t.Fatalf("the machine's kernel logged %q:\n%s", bad, lastLines(pc1.out.String(), 40))
		}
	}
	// The first server is still down: the next power-on boots from the
	// second one.
	_ = pc1.cmd.Wait()
	pc1 = ns.bootVM("tap1", "52:54:00:77:00:01")
	pc1.wait(t, regexp.MustCompile(`deskway: root disk golden/pc1/[0-9a-f]{16} from 10\.77\.0\.1:10810 `), 4*time.Minute)
	pc1.wait(t, regexp.MustCompile(`DESKWAY writing`), time.Minute)
	io.WriteString(pc1.in, "go\n")
	pc1.wait(t, regexp.MustCompile(`DESKWAY read: before the loss / after the loss / `), 2*time.Minute)
}
