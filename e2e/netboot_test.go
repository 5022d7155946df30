package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

const netbootConfig = `state_dir: %[1]s
log: {level: info, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
stream:
  listen: "10.77.0.1:10809"
  tls: "off"
  clients: open
  vdisks:
  - {name: golden, base: %[3]s, kernel: %[4]s, initrd: %[5]s, cmdline: "console=ttyS0 panic=-1 quiet"}
  netboot:
    interface: br0
    address: 10.77.0.1
    dhcp: full
    pool: {start: 10.77.0.100, end: 10.77.0.150}
`

// netns is a network namespace the test made: a bridge br0 at
// 10.77.0.1/24 with tap devices on it, reaching nothing outside.
type netns struct {
	t    *testing.T
	name string
}

func newNetns(t *testing.T, taps ...string) *netns {
	t.Helper()
	testkit.RequireRoot(t)
	testkit.Require(t, "ip", "qemu-system-x86_64", "busybox")
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := &netns{t: t, name: "dwnb-" + hex.EncodeToString(b[:])}
	if out, err := exec.Command("ip", "netns", "add", n.name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.name).Run() })
	n.run("ip", "link", "set", "lo", "up")
	n.run("ip", "link", "add", "br0", "type", "bridge")
	n.run("ip", "addr", "add", "10.77.0.1/24", "dev", "br0")
	n.run("ip", "link", "set", "br0", "up")
	for _, tap := range taps {
		n.run("ip", "tuntap", "add", tap, "mode", "tap")
		n.run("ip", "link", "set", tap, "master", "br0", "up")
	}
	return n
}

func (n *netns) run(args ...string) string {
	n.t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.name}, args...)...).CombinedOutput()
	if err != nil {
		n.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// vm is a qemu machine with no disk, only a virtio NIC on tap with mac and
// qemu's iPXE option ROM, booting from the network; its serial console
// (where SeaBIOS, iPXE and the kernel write with -nographic) is out.
type vm struct {
	cmd *exec.Cmd
	out *lockedBuffer
	in  io.WriteCloser
}

func (n *netns) bootVM(tap, mac string) *vm {
	n.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", n.name, "qemu-system-x86_64", "-machine", "accel=tcg", "-m", "256", "-smp", "1",
		"-nographic", "-monitor", "none", "-no-reboot", "-boot", "n",
		"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no", "-device", "virtio-net-pci,netdev=n0,mac="+mac)
	v := &vm{cmd: cmd, out: &lockedBuffer{}}
	cmd.Stdout, cmd.Stderr = v.out, v.out
	var err error
	if v.in, err = cmd.StdinPipe(); err != nil {
		n.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return v
}

// wait returns the first match of re on the console within d.
func (v *vm) wait(t *testing.T, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if m := re.FindStringSubmatch(v.out.String()); m != nil {
			return m
		}
	}
	t.Fatalf("the VM's console never showed %q:\n%s", re, lastLines(strings.ReplaceAll(v.out.String(), "\r", ""), 40))
	return nil
}

// netbootKit is Debian's kernel and an initramfs whose /init prints the
// command line deskway's script gave the kernel, then powers off.
func netbootKit(t *testing.T) (kernel, initrd string) {
	t.Helper()
	kernels, _ := filepath.Glob(filepath.Join(testkit.KernelDir, "boot", "vmlinuz-*"))
	if len(kernels) == 0 {
		t.Fatalf("no Debian kernel in %s: run scripts/install-deps.sh", testkit.KernelDir)
	}
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"bin", "proc"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	bb, _ := exec.LookPath("busybox")
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755)
	os.WriteFile(filepath.Join(root, "init"), []byte(`#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
echo "DESKWAY netboot $(/bin/busybox cat /proc/cmdline)"
/bin/busybox poweroff -f
`), 0o755)
	initrd = filepath.Join(filepath.Dir(root), "initrd.cpio")
	if out, err := exec.Command("sh", "-c", "cd "+root+" && busybox find . | busybox cpio -o -H newc > "+initrd).CombinedOutput(); err != nil {
		t.Fatalf("initramfs: %v\n%s", err, out)
	}
	return kernels[0], initrd
}

// TestNetbootBareVM: machines with no disk power on in a network
// namespace and boot from deskway: a DHCP lease and an iPXE script from
// deskway, the kernel and initramfs of the vDisk their device record
// names over HTTP, and a kernel command line naming their own export
// with a fresh boot id per power-on. A disabled device and an unknown
// machine do not boot and their consoles say why; enabling the device
// lets it boot at its next try, without a power cycle.
func TestNetbootBareVM(t *testing.T) {
	ns := newNetns(t, "tap1", "tap2", "tap3")
	kernel, initrd := netbootKit(t)
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	os.WriteFile(base, nil, 0o600)
	os.Truncate(base, 16<<20)
	cfg := filepath.Join(dir, "deskway.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(netbootConfig, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd)), 0o600)
	srv := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(srv.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the boot services did not start:\n%s", srv.Log.String())
		}
	}
	deskway := func(args ...string) string {
		t.Helper()
		return ns.run(append([]string{bin}, append(args, "-c", cfg)...)...)
	}
	if out := deskway("device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden"); !strings.Contains(out, "pc1 (52:54:00:77:00:01): vDisk golden, enabled") {
		t.Fatalf("device add:\n%s", out)
	}
	deskway("device", "add", "--mac", "52:54:00:77:00:02", "--name", "pc2", "--vdisk", "golden", "--disabled")

	pc1, pc2, stranger := ns.bootVM("tap1", "52:54:00:77:00:01"), ns.bootVM("tap2", "52:54:00:77:00:02"), ns.bootVM("tap3", "52:54:00:77:00:09")
	booted := regexp.MustCompile(`DESKWAY netboot .*deskway\.device=pc1 deskway\.export=golden/pc1/([0-9a-f]{16}) deskway\.mode=standard deskway\.servers=10\.77\.0\.1:10809`)
	first := pc1.wait(t, booted, 3*time.Minute)[1]
	pc2.wait(t, regexp.MustCompile(`deskway: device pc2 \(52:54:00:77:00:02\) is disabled by an administrator`), 2*time.Minute)
	stranger.wait(t, regexp.MustCompile(`deskway: this machine \(52:54:00:77:00:09\) is not a registered device`), 2*time.Minute)
	if !strings.Contains(pc1.out.String(), "10.77.0.1") || !regexp.MustCompile(`net0: 10\.77\.0\.1[0-5]\d/255\.255\.255\.0`).MatchString(pc1.out.String()) {
		t.Fatalf("pc1 did not get its address from deskway's pool:\n%s", lastLines(pc1.out.String(), 40))
	}

	// pc2 enabled: a key at its console tries again at once, and it boots.
	deskway("device", "enable", "pc2")
	io.WriteString(pc2.in, "\n")
	pc2.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.export=golden/pc2/[0-9a-f]{16} `), 3*time.Minute)

	// pc1 powers on again: a new boot id, so its last boot's writes are gone.
	_ = pc1.cmd.Wait()
	pc1 = ns.bootVM("tap1", "52:54:00:77:00:01")
	if again := pc1.wait(t, booted, 3*time.Minute)[1]; again == first {
		t.Fatalf("pc1's second power-on has the first one's boot id %s", first)
	}
	// A firmware PXE client's first stage comes over TFTP: iPXE from
	// Debian's ipxe package, and nothing else.
	got := filepath.Join(dir, "undionly.kpxe")
	ns.run("busybox", "tftp", "-g", "-r", "undionly.kpxe", "-l", got, "10.77.0.1")
	if fileSum(t, got) != fileSum(t, "/usr/lib/ipxe/undionly.kpxe") {
		t.Fatal("undionly.kpxe over TFTP differs from Debian's")
	}
	if out, err := exec.Command("ip", "netns", "exec", ns.name, "busybox", "tftp", "-g", "-r", "../../etc/passwd", "-l", filepath.Join(dir, "passwd"), "10.77.0.1").CombinedOutput(); err == nil {
		t.Fatalf("TFTP served a file outside the iPXE files:\n%s", out)
	}
	ls := deskway("device", "ls")
	if !regexp.MustCompile(`(?m)^pc1\s+52:54:00:77:00:01\s+-\s+golden\s+-\s+enabled\s+\d{4}-`).MatchString(ls) {
		t.Fatalf("device ls:\n%s", ls)
	}
	for _, want := range []string{"network boot refused", "reason=unknown", "reason=disabled", `msg="network boot" role=netboot mac=52:54:00:77:00:01 device=pc1`} {
		if !strings.Contains(srv.Log.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, lastLines(srv.Log.String(), 30))
		}
	}
}
