package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// KernelDir is where scripts/install-deps.sh unpacks Debian's
// linux-image package (not installed: only its files are used).
const KernelDir = "/var/cache/deskway/kernel"

// initModules are loaded in this order by the test initramfs: what a
// virtio disk with ext4 needs from Debian's modular kernel.
var initModules = []string{
	"lib/crc16", "crypto/crc32c_generic", "fs/mbcache", "fs/jbd2/jbd2", "fs/ext4/ext4",
	"drivers/virtio/virtio_ring", "drivers/virtio/virtio", "drivers/virtio/virtio_pci_modern_dev",
	"drivers/virtio/virtio_pci_legacy_dev", "drivers/virtio/virtio_pci", "drivers/block/virtio_blk",
}

// BootKit is a Debian kernel and a busybox initramfs that mounts the
// virtio disk as ext4 and runs the script given on the kernel command
// line's init payload.
type BootKit struct {
	Kernel, Initrd string
}

// NewBootKit builds the initramfs in a temporary directory: busybox from
// busybox-static, the modules above from the unpacked kernel package, and
// an /init that loads them, mounts /dev/vda on /mnt, runs script, prints
// "DESKWAY-DONE" and powers off. Lines the script wants checked should
// start with "DESKWAY ".
func NewBootKit(t testing.TB, script string) *BootKit {
	t.Helper()
	Require(t, "busybox", "qemu-system-x86_64")
	kernels, _ := filepath.Glob(filepath.Join(KernelDir, "boot", "vmlinuz-*"))
	if len(kernels) == 0 {
		missingThing(t, "a Debian kernel in "+KernelDir)
	}
	kernel := kernels[0]
	version := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"bin", "dev", "proc", "sys", "mnt", "modules"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, _ := exec.LookPath("busybox")
	copyFile(t, bb, filepath.Join(root, "bin", "busybox"), 0o755)
	var load strings.Builder
	for _, m := range initModules {
		src := filepath.Join(KernelDir, "lib", "modules", version, "kernel", m+".ko")
		dst := filepath.Join(root, "modules", filepath.Base(m)+".ko")
		copyFile(t, src, dst, 0o644)
		load.WriteString("insmod /modules/" + filepath.Base(m) + ".ko || echo \"DESKWAY insmod failed: " + filepath.Base(m) + "\"\n")
	}
	initScript := `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
` + load.String() + `
ID=$(sed -n 's/.*deskway.id=\([^ ]*\).*/\1/p' /proc/cmdline)
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
if mount -t ext4 /dev/vda /mnt; then
` + script + `
  umount /mnt
else
  echo "DESKWAY mount failed"
fi
echo DESKWAY-DONE
poweroff -f
`
	if err := os.WriteFile(filepath.Join(root, "init"), []byte(initScript), 0o755); err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(filepath.Dir(root), "initrd.cpio")
	cmd := exec.Command("sh", "-c", "cd "+root+" && busybox find . | busybox cpio -o -H newc > "+initrd)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initramfs: %v\n%s", err, out)
	}
	return &BootKit{Kernel: kernel, Initrd: initrd}
}

// Command returns a qemu-system-x86_64 (TCG, no display) that boots the
// kit with drive as its virtio disk and id on the kernel command line.
func (k *BootKit) Command(drive, id string) *exec.Cmd {
	return exec.Command("qemu-system-x86_64", "-machine", "accel=tcg", "-m", "256", "-smp", "1",
		"-kernel", k.Kernel, "-initrd", k.Initrd,
		"-append", "console=ttyS0 panic=-1 quiet deskway.id="+id,
		"-drive", "file="+drive+",format=raw,if=virtio,cache=none",
		"-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot")
}

func copyFile(t testing.TB, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}
