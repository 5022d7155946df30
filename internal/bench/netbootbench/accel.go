package netbootbench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// kvmAPIVersion is the only API version Linux's KVM has reported since
// 2.6.22; another answer is not a KVM qemu can use.
const kvmAPIVersion = 12

// kvmGetAPIVersion is KVM_GET_API_VERSION, _IO(0xAE, 0x00).
const kvmGetAPIVersion = 0xAE00

// probeTime bounds the trial boot: a kernel on KVM prints its banner in
// well under a second, and one that has not in this long is stuck.
const probeTime = 5 * time.Second

// Accelerator is qemu's accelerator for the VMs of the bench and the
// network-boot tests, and why: KVM when a guest kernel runs on this
// machine's /dev/kvm, qemu's own emulator (TCG) otherwise, so the same
// VMs run either way and each run can say which it had.
type Accelerator struct {
	Name string // "kvm" or "tcg"
	Why  string // a sentence for logs and results
}

// Args are qemu's options for the accelerator.
func (a Accelerator) Args() []string { return []string{"-accel", a.Name} }

// ProbeAccelerator chooses KVM when /dev/kvm opens for reading and writing, answers
// KVM's API version, and kernel (a bzImage, started with no initramfs)
// prints its banner on a KVM guest's serial console. The device alone
// does not prove it: under nested virtualization qemu may start on a
// /dev/kvm whose guests never get past the kernel's decompressor.
func ProbeAccelerator(ctx context.Context, kernel string) Accelerator {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return Accelerator{"tcg", fmt.Sprintf("no usable /dev/kvm (%v)", err)}
	}
	v, err := unix.IoctlRetInt(int(f.Fd()), kvmGetAPIVersion)
	f.Close()
	if err != nil || v != kvmAPIVersion {
		return Accelerator{"tcg", fmt.Sprintf("/dev/kvm answers API version %d (%v), not %d", v, err, kvmAPIVersion)}
	}
	ctx, cancel := context.WithTimeout(ctx, probeTime)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-accel", "kvm", "-m", "128", "-smp", "1", "-nographic", "-monitor", "none",
		"-no-reboot", "-net", "none", "-kernel", kernel, "-append", "console=ttyS0 panic=-1")
	out := &bannerWriter{seen: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return Accelerator{"tcg", fmt.Sprintf("qemu on KVM did not start: %v", err)}
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	select {
	case <-out.seen:
		return Accelerator{"kvm", "a guest kernel boots on /dev/kvm"}
	case <-ctx.Done():
		return Accelerator{"tcg", fmt.Sprintf("/dev/kvm answers (API version %d), but a guest kernel printed nothing on it in %s: KVM here runs no guest%s", v, probeTime, pvmNote())}
	}
}

// pvmNote says why when this machine's KVM is PVM (the kvm_pvm module:
// KVM inside a VM with no hardware virtualization), which runs only
// guest kernels built as PVM guests; Debian's kernel is not one, and
// stops at its first switch of CPU mode (after SeaBIOS's "Probing
// EDD", or at once through the PVH entry).
func pvmNote() string {
	if _, err := os.Stat("/sys/module/kvm_pvm"); err != nil {
		return ""
	}
	return " (its KVM is PVM, the kvm_pvm module, which runs only guest kernels built for PVM)"
}

// bannerWriter closes seen when the kernel's "Linux version" banner has
// been written to it.
type bannerWriter struct {
	mu   sync.Mutex
	buf  []byte
	seen chan struct{}
	done bool
}

func (b *bannerWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done {
		b.buf = append(b.buf, p...)
		if bytes.Contains(b.buf, []byte("Linux version")) {
			b.done = true
			close(b.seen)
		}
		if len(b.buf) > 64 {
			b.buf = b.buf[len(b.buf)-64:] // enough for a banner split across writes
		}
	}
	return len(p), nil
}
