package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/netbootbench"
	"github.com/deskway/deskway/internal/bench/procstat"
	"github.com/deskway/deskway/internal/testkit"
)

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

// vm is a qemu machine with no disk, only a virtio NIC on a tap,
// booting from the network; its serial console (where the firmware,
// iPXE and the kernel write with -nographic) is out.
type vm struct {
	cmd     *exec.Cmd
	out     *lockedBuffer
	in      io.WriteCloser
	started time.Time
	lastCPU time.Duration // the last CPU time read from /proc
}

// bootVM starts a BIOS machine (SeaBIOS) whose NIC has mac and qemu's
// iPXE option ROM.
func (n *netns) bootVM(tap, mac string) *vm {
	n.t.Helper()
	return n.startVM("-m", "256", "-boot", "n", "-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no", "-device", "virtio-net-pci,netdev=n0,mac="+mac)
}

// startVM starts qemu-system-x86_64 in the namespace with args, on KVM
// when this machine has it, its serial console on the vm's out.
func (n *netns) startVM(args ...string) *vm {
	n.t.Helper()
	accel := vmAccel()
	n.t.Logf("qemu accelerator: %s (%s)", accel.Name, accel.Why)
	args = append(append([]string{"netns", "exec", n.name, "qemu-system-x86_64"}, accel.Args()...),
		append([]string{"-smp", "1", "-nographic", "-monitor", "none", "-no-reboot"}, args...)...)
	cmd := exec.Command("ip", args...)
	v := &vm{cmd: cmd, out: &lockedBuffer{}, started: time.Now()}
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

// exited says qemu has ended (a zombie until the test reaps it).
func (v *vm) exited() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", v.cmd.Process.Pid))
	return err != nil || bytes.Contains(b, []byte(") Z "))
}

// vmAccel is the accelerator of the test binary's VMs, probed once: a
// probe that finds KVM unusable waits seconds for a guest that never
// starts.
var vmAccel = sync.OnceValue(func() netbootbench.Accelerator {
	kernels, _ := filepath.Glob(filepath.Join(testkit.KernelDir, "boot", "vmlinuz-*"))
	if len(kernels) == 0 {
		return netbootbench.Accelerator{Name: "tcg", Why: "no kernel to try KVM with"}
	}
	return netbootbench.ProbeAccelerator(context.Background(), kernels[0])
})

// wait returns the first match of re on the console once the guest has
// had d of CPU time at most (qemu's user and system time since the
// wait began), or fails. A budget of CPU, not of wall time, holds
// whatever else the machine runs: an emulated guest on a busy machine
// gets a fraction of a core, and a boot that takes 40 s alone took over
// 2 minutes beside the rest of the run. A guest waiting on the network
// spends almost no CPU, so the wait also ends after guestWallFactor × d
// of wall time.
func (v *vm) wait(t *testing.T, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	gone := false
	cpu0, began := v.cpu(), time.Now()
	for ; v.cpu()-cpu0 < d && time.Since(began) < guestWallFactor*d; time.Sleep(200 * time.Millisecond) {
		out := v.out.String()
		if m := re.FindStringSubmatch(out); m != nil {
			// Where a guest's boot spends its time, for the run's log.
			t.Logf("guest %d: console showed %.40q %.1f s after qemu started (%.1f s of CPU in this wait)",
				v.cmd.Process.Pid, m[0], time.Since(v.started).Seconds(), (v.cpu() - cpu0).Seconds())
			return m
		}
		if gone || strings.Contains(out, "reboot: Power down") || strings.Contains(out, "BdsDxe: failed to load") {
			break // the machine is off, or its UEFI firmware could not boot from the network: nothing more will come
		}
		// qemu gone: its last output is read at the next look.
		gone = v.exited()
	}
	t.Fatalf("the VM's console never showed %q (%.1f s of CPU, %.1f s of wall time in this wait):\n%s", re,
		(v.cpu() - cpu0).Seconds(), time.Since(began).Seconds(), lastLines(strings.ReplaceAll(v.out.String(), "\r", ""), 40))
	return nil
}

// guestWallFactor bounds a wait in wall time, as a multiple of its CPU
// budget.
const guestWallFactor = 4

// cpu is the CPU time qemu has had so far, all its threads (ip netns
// exec runs qemu in its own process), or what it had when it ended.
func (v *vm) cpu() time.Duration {
	if c, ok := procCPU(v.cmd.Process.Pid); ok {
		v.lastCPU = c
	}
	return v.lastCPU
}

// procCPU is the user and system time process pid has had, all its
// threads.
func procCPU(pid int) (time.Duration, bool) {
	s, err := procstat.Read(pid)
	return s.CPU, err == nil
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

// buildNbdroot returns deskway-nbdroot, static, as make build builds
// it: the first test to ask links it beside build's binary, and the run's
// other root-disk tests share it (each linked its own before).
func buildNbdroot(t *testing.T) string {
	t.Helper()
	dir := filepath.Dir(build(t))
	helper := filepath.Join(dir, "deskway-nbdroot")
	if _, err := os.Stat(helper); err == nil {
		return helper
	}
	testkit.LockDuring(t, buildLocks(dir)[1], func() {
		if _, err := os.Stat(helper); err == nil {
			return
		}
		build := exec.Command("go", "build", "-ldflags=-s", "-o", helper+".new", "../cmd/deskway-nbdroot")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build deskway-nbdroot: %v\n%s", err, out)
		}
		if err := os.Rename(helper+".new", helper); err != nil {
			t.Fatal(err)
		}
	})
	return helper
}
