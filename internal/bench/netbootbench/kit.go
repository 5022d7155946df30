package netbootbench

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/deskway/deskway/internal/initramfs"
)

// KernelDir is where scripts/install-deps.sh unpacks Debian's kernel.
const KernelDir = "/var/cache/deskway/kernel"

// Marker is what the vDisk's /sbin/init prints once the machine runs
// from it, followed by the device's name.
const Marker = "DESKWAY up "

// Kernel returns the unpacked Debian kernel and its version.
func Kernel() (path, version string, err error) {
	ks, _ := filepath.Glob(filepath.Join(KernelDir, "boot", "vmlinuz-*"))
	if len(ks) == 0 {
		return "", "", fmt.Errorf("no Debian kernel in %s: run scripts/install-deps.sh", KernelDir)
	}
	return ks[0], strings.TrimPrefix(filepath.Base(ks[0]), "vmlinuz-"), nil
}

// RootInitramfs builds, in dir, the initramfs of a network-booted
// machine as an operator gets it from `deskway stream initramfs`: the
// root disk through deskway-nbdroot (helper) and the kernel NBD driver.
func RootInitramfs(dir, helper string) (string, error) {
	modules, bb, err := kitParts()
	if err != nil {
		return "", err
	}
	return writeInitramfs(dir, func(w io.Writer) error {
		_, err := initramfs.Build(w, initramfs.Options{Modules: modules, Nbdroot: helper, Busybox: bb})
		return err
	})
}

// kitParts are the unpacked kernel's module tree and the static busybox.
func kitParts() (modules, busybox string, err error) {
	_, version, err := Kernel()
	if err != nil {
		return "", "", err
	}
	if busybox, err = exec.LookPath("busybox"); err != nil {
		return "", "", fmt.Errorf("busybox (busybox-static) is needed: %w", err)
	}
	return filepath.Join(KernelDir, "lib", "modules", version), busybox, nil
}

// DiskInitramfs builds, in dir, the initramfs of a machine whose root is
// its virtio disk (qemu's own NBD client behind it).
func DiskInitramfs(dir string) (string, error) {
	modules, bb, err := kitParts()
	if err != nil {
		return "", err
	}
	mods, err := initramfs.Resolve(modules, []string{"virtio_pci", "virtio_blk", "ext4"}, nil)
	if err != nil {
		return "", err
	}
	files := append(initramfs.ModuleFiles(mods),
		initramfs.File{Name: "bin/busybox", Source: bb, Mode: 0o755},
		initramfs.File{Name: "init", Mode: 0o755, Data: []byte(`#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod /modules/$m.ko; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
mkdir -p /newroot
mount -t ext4 /dev/vda /newroot || { echo "deskway: root disk not mounted"; poweroff -f; }
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
`)})
	return writeInitramfs(dir, func(w io.Writer) error { return initramfs.Write(w, files) })
}

func writeInitramfs(dir string, build func(io.Writer) error) (string, error) {
	out := filepath.Join(dir, "initrd.cpio")
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	if err := build(f); err != nil {
		f.Close()
		return "", err
	}
	return out, f.Close()
}

// VDisk makes an ext4 image at path whose /sbin/init prints Marker and
// the device's name (deskway.device, or deskway.id), then powers off.
func VDisk(path string) error {
	src, err := os.MkdirTemp(filepath.Dir(path), "vdisk-src")
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	for _, d := range []string{"bin", "sbin", "dev", "proc", "sys"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			return err
		}
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return err
	}
	if err := copyFile(bb, filepath.Join(src, "bin", "busybox")); err != nil {
		return err
	}
	init := `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
DEV=$(sed -n 's/.*deskway\.\(device\|id\)=\([^ ]*\).*/\2/p' /proc/cmdline)
echo "` + Marker + `$DEV"
poweroff -f
`
	if err := os.WriteFile(filepath.Join(src, "sbin", "init"), []byte(init), 0o755); err != nil {
		return err
	}
	if b, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "golden", "-d", src, path, "64M").CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, b)
	}
	return nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}
