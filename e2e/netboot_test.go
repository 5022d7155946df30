package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/bench/netbootbench"
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
		out := v.out.String()
		if m := re.FindStringSubmatch(out); m != nil {
			return m
		}
		if strings.Contains(out, "reboot: Power down") {
			break // the machine is off: nothing more will come
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
	// Refused by the server, in so many words: a timeout or a client
	// error would not show that deskway read the request and said no.
	passwd := filepath.Join(dir, "passwd")
	out, err := exec.Command("ip", "netns", "exec", ns.name, "busybox", "tftp", "-g", "-r", "../../etc/passwd", "-l", passwd, "10.77.0.1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `tftp: server error: (1) no file "../../etc/passwd" here`) {
		t.Fatalf("TFTP asked for ../../etc/passwd: %v, want the server's refusal:\n%s", err, out)
	}
	if _, err := os.Stat(passwd); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("TFTP asked for ../../etc/passwd left %s: %v", passwd, err)
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

// netbootRootKit is Debian's kernel and the initramfs of a network-booted
// machine, built as an operator builds it (deskway stream initramfs):
// the NIC and NBD modules, an address over DHCP, the root disk through
// deskway-nbdroot and the kernel's NBD driver, then switch_root to the
// vDisk's init.
func netbootRootKit(t *testing.T) (kernel, initrd string) {
	t.Helper()
	kernel, version, err := netbootbench.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	initrd = filepath.Join(t.TempDir(), "netboot.initrd")
	out, err := exec.Command(build(t), "stream", "initramfs", "--modules", filepath.Join(testkit.KernelDir, "lib", "modules", version),
		"--busybox", bb, "--nbdroot", buildNbdroot(t), "--out", initrd).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "wrote "+initrd+": ") || !regexp.MustCompile(`modules \(.*\bnbd\b.*\bvirtio_net\b`).MatchString(string(out)) {
		t.Fatalf("deskway stream initramfs: %v\n%s", err, out)
	}
	return kernel, initrd
}

// rootImage is an ext4 vDisk whose /sbin/init says what it sees, writes
// a file named after the device, waits for a line on the console, then
// lists the disk again as the server has it and powers off.
func rootImage(t *testing.T, path string) {
	t.Helper()
	vdiskWithInit(t, path, map[string]string{"golden.txt": "golden image v1\n"}, `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
DEV=$(sed -n 's/.*deskway\.device=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "DESKWAY root $DEV: $(cat /golden.txt) files: $(ls / | tr '\n' ' ')"
echo "written by $DEV" > /$DEV.txt
sync
echo "DESKWAY written $DEV"
read -r word
echo 3 > /proc/sys/vm/drop_caches
echo "DESKWAY after $DEV: $(ls / | tr '\n' ' ')"
poweroff -f
`)
}

// vdiskWithInit makes a 64 MiB ext4 vDisk at path with busybox, the
// files given, and init as its /sbin/init.
func vdiskWithInit(t *testing.T, path string, files map[string]string, init string) {
	t.Helper()
	testkit.Require(t, "mkfs.ext4", "busybox")
	src := filepath.Join(t.TempDir(), "src")
	for _, d := range []string{"bin", "sbin", "dev", "proc", "sys"} {
		os.MkdirAll(filepath.Join(src, d), 0o755)
	}
	bb, _ := exec.LookPath("busybox")
	b, _ := os.ReadFile(bb)
	os.WriteFile(filepath.Join(src, "bin", "busybox"), b, 0o755)
	for name, body := range files {
		os.WriteFile(filepath.Join(src, name), []byte(body), 0o644)
	}
	os.WriteFile(filepath.Join(src, "sbin", "init"), []byte(init), 0o755)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "golden", "-d", src, path, "64M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
}

const netbootRootConfig = `state_dir: %[1]s
log: {level: debug, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
stream:
  listen: "10.77.0.1:10809"
  tls: "off"
  clients: open
  vdisks:
  - {name: golden, base: %[3]s, kernel: %[4]s, initrd: %[5]s, cmdline: "console=ttyS0 panic=-1 quiet"}
  - {name: personal, mode: private, base: %[3]s, kernel: %[4]s, initrd: %[5]s, cmdline: "console=ttyS0 panic=-1 quiet", clients: [pc3]}
  netboot:
    interface: br0
    address: 10.77.0.1
    dhcp: full
    pool: {start: 10.77.0.100, end: 10.77.0.150}
`

// TestNetbootRootOverNBD: bare VMs boot from deskway over PXE and run
// from their vDisk, mounted as root through the kernel's NBD client. Two
// standard-mode devices boot at once from one vDisk and neither sees the
// other's file; a standard-mode device's file is gone at its next
// power-on; a private-mode device's file is still there.
func TestNetbootRootOverNBD(t *testing.T) {
	ns := newNetns(t, "tap1", "tap2", "tap3")
	kernel, initrd := netbootRootKit(t)
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	rootImage(t, base)
	cfg := filepath.Join(dir, "deskway.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(netbootRootConfig, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd)), 0o600)
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
	deskway("device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden")
	deskway("device", "add", "--mac", "52:54:00:77:00:02", "--name", "pc2", "--vdisk", "golden")
	deskway("device", "add", "--mac", "52:54:00:77:00:03", "--name", "pc3", "--vdisk", "personal")

	written := func(v *vm, dev string) {
		t.Helper()
		v.wait(t, regexp.MustCompile(`DESKWAY root `+dev+`: golden image v1 files: `), 4*time.Minute)
		v.wait(t, regexp.MustCompile(`DESKWAY written `+dev), time.Minute)
	}
	after := func(v *vm, dev string) string {
		t.Helper()
		io.WriteString(v.in, "go\n")
		return v.wait(t, regexp.MustCompile(`DESKWAY after `+dev+`: ([^\r\n]*)`), time.Minute)[1]
	}
	// Two standard-mode devices at once: each has written and synced
	// before either lists the disk as the server has it.
	pc1, pc2 := ns.bootVM("tap1", "52:54:00:77:00:01"), ns.bootVM("tap2", "52:54:00:77:00:02")
	written(pc1, "pc1")
	written(pc2, "pc2")
	if got := after(pc1, "pc1"); !strings.Contains(got, "pc1.txt") || strings.Contains(got, "pc2.txt") {
		t.Fatalf("pc1 sees %q: its own file, and not pc2's, expected", got)
	}
	if got := after(pc2, "pc2"); !strings.Contains(got, "pc2.txt") || strings.Contains(got, "pc1.txt") {
		t.Fatalf("pc2 sees %q", got)
	}
	_ = pc1.cmd.Wait()
	_ = pc2.cmd.Wait()
	// pc1 again: a new boot, its file is gone. pc3 (private) twice: kept.
	pc1 = ns.bootVM("tap1", "52:54:00:77:00:01")
	pc3 := ns.bootVM("tap3", "52:54:00:77:00:03")
	written(pc1, "pc1")
	written(pc3, "pc3")
	if first := pc1.wait(t, regexp.MustCompile(`DESKWAY root pc1: golden image v1 files: ([^\r\n]*)`), time.Second)[1]; strings.Contains(first, "pc1.txt") {
		t.Fatalf("pc1's second power-on found its first boot's file: %q", first)
	}
	after(pc1, "pc1")
	after(pc3, "pc3")
	_ = pc3.cmd.Wait()
	pc3 = ns.bootVM("tap3", "52:54:00:77:00:03")
	if first := pc3.wait(t, regexp.MustCompile(`DESKWAY root pc3: golden image v1 files: ([^\r\n]*)`), 4*time.Minute)[1]; !strings.Contains(first, "pc3.txt") {
		t.Fatalf("private-mode pc3 lost its file across a power-off: %q", first)
	}
}

// TestNetbootProxyDHCP: on a network whose addresses come from its own
// DHCP server (busybox udhcpd here), deskway in proxyDHCP mode answers
// only the boot options: the machine takes its address from udhcpd and
// its boot file from deskway, and boots.
func TestNetbootProxyDHCP(t *testing.T) {
	ns := newNetns(t, "tap1")
	kernel, initrd := netbootKit(t)
	bin := build(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "udhcpd.conf")
	os.WriteFile(conf, []byte("start 10.77.0.50\nend 10.77.0.60\ninterface br0\nlease_file "+filepath.Join(dir, "udhcpd.leases")+"\noption subnet 255.255.255.0\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "udhcpd.leases"), nil, 0o600)
	testkit.Start(t, nil, "ip", "netns", "exec", ns.name, "busybox", "udhcpd", "-f", conf)
	base := filepath.Join(dir, "golden.img")
	os.WriteFile(base, nil, 0o600)
	os.Truncate(base, 16<<20)
	cfg := filepath.Join(dir, "deskway.yaml")
	proxy := strings.Replace(netbootConfig, "    dhcp: full\n    pool: {start: 10.77.0.100, end: 10.77.0.150}\n", "    dhcp: proxy\n", 1)
	os.WriteFile(cfg, []byte(fmt.Sprintf(proxy, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd)), 0o600)
	srv := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(srv.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the boot services did not start:\n%s", srv.Log.String())
		}
	}
	ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden", "-c", cfg)
	pc1 := ns.bootVM("tap1", "52:54:00:77:00:01")
	pc1.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.device=pc1 deskway\.export=golden/pc1/[0-9a-f]{16} `), 3*time.Minute)
	if !regexp.MustCompile(`net0: 10\.77\.0\.(5\d|60)/`).MatchString(pc1.out.String()) {
		t.Fatalf("pc1's address is not udhcpd's:\n%s", lastLines(pc1.out.String(), 40))
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "netboot-leases.json")); err == nil {
		t.Fatal("a proxy recorded leases of its own")
	}
}

// buildNbdroot builds deskway-nbdroot, static, as make build does.
func buildNbdroot(t *testing.T) string {
	t.Helper()
	helper := filepath.Join(t.TempDir(), "deskway-nbdroot")
	build := exec.Command("go", "build", "-ldflags=-s", "-o", helper, "../cmd/deskway-nbdroot")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build deskway-nbdroot: %v\n%s", err, out)
	}
	return helper
}

// TestNetbootBenchSmoke runs `deskway bench netboot` once and checks the
// result's shape: every boot reached the vDisk's init, and each step was
// timed.
func TestNetbootBenchSmoke(t *testing.T) {
	testkit.RequireRoot(t)
	testkit.Require(t, "ip", "qemu-system-x86_64", "busybox", "mkfs.ext4")
	out := t.TempDir()
	res := runBench(t, out, "netboot", "--runs", "1", "--nbdroot", buildNbdroot(t))
	for _, k := range []string{"pxe_boot_s", "nbd_boot_s", "pxe_ratio_nbd", "pxe4_ratio_pxe1", "nbd4_ratio_nbd1"} {
		if v, ok := res.Summary[k]; !ok || v <= 0 {
			t.Errorf("summary %s = %v", k, v)
		}
	}
	seen := map[string]int{}
	for _, p := range res.Points {
		seen[p.Scenario+"/"+p.System]++
		if p.Metrics["boot_s"] <= 0 || p.System == "deskway-pxe" && (p.Metrics["dhcp_s"] <= 0 || p.Metrics["script_s"] <= p.Metrics["dhcp_s"] || p.Metrics["root_s"] <= p.Metrics["script_s"]) {
			t.Errorf("point %+v", p)
		}
	}
	if seen["boot-one/deskway-pxe"] != 1 || seen["boot-one/qemu-nbd-direct"] != 1 || seen["boot-four/deskway-pxe"] != 4 || seen["boot-four/qemu-nbd-direct"] != 4 {
		t.Fatalf("points %v", seen)
	}
	if _, err := os.Stat(filepath.Join(out, "result.md")); err != nil {
		t.Error(err)
	}
}

// TestNetbootAnswersRouterSolicitations: iPXE waits for an IPv6 router
// as well as for DHCP before it boots. On a boot network of deskway's own
// (dhcp: full) deskway answers router solicitations with an advertisement
// that offers nothing and names no default router; a flood of
// solicitations gets at most one answer a second; a proxyDHCP server,
// whose network has its own routers, stays silent unless told otherwise.
// The solicitations come from Debian's rdisc6 on the far end of a veth
// pair on the boot network's bridge.
func TestNetbootAnswersRouterSolicitations(t *testing.T) {
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
	pc1 := ns.bootVM("tap1", "52:54:00:77:00:01")
	pc1.wait(t, regexp.MustCompile(`deskway: root disk golden/pc1/[0-9a-f]{16} from 10\.77\.0\.1:10809 `), 4*time.Minute)
	pc1.wait(t, regexp.MustCompile(`DESKWAY writing`), time.Minute)

	if err := syscall.Kill(-first.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	pc1.wait(t, regexp.MustCompile(`deskway: root disk golden/pc1/[0-9a-f]{16} from 10\.77\.0\.1:10810 `), 2*time.Minute)
	io.WriteString(pc1.in, "go\n")
	got := pc1.wait(t, regexp.MustCompile(`DESKWAY read: ([^\r\n]*)`), 3*time.Minute)[1]
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
