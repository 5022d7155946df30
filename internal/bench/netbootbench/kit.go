package netbootbench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// KernelDir is where scripts/install-deps.sh unpacks Debian's kernel.
const KernelDir = "/var/cache/deskway/kernel"

// Module paths (under lib/modules/VERSION/kernel, without .ko) in load
// order: ext4, virtio, and either a virtio disk or a virtio NIC with the
// kernel NBD client.
var (
	baseModules = []string{"lib/crc16", "crypto/crc32c_generic", "fs/mbcache", "fs/jbd2/jbd2", "fs/ext4/ext4",
		"drivers/virtio/virtio_ring", "drivers/virtio/virtio", "drivers/virtio/virtio_pci_modern_dev",
		"drivers/virtio/virtio_pci_legacy_dev", "drivers/virtio/virtio_pci"}
	diskModules = []string{"drivers/block/virtio_blk"}
	netModules  = []string{"net/core/failover", "drivers/net/net_failover", "drivers/net/virtio_net", "drivers/block/nbd"}
)

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
// machine: modules for a virtio NIC and NBD, an address over DHCP, the
// root disk through deskway-nbdroot (helper) and the kernel NBD driver,
// then switch_root to the vDisk's /sbin/init.
func RootInitramfs(dir, helper string) (string, error) {
	return initramfs(dir, append(baseModules, netModules...), map[string]string{"bin/deskway-nbdroot": helper}, `
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
ip link set eth0 up
udhcpc -i eth0 -s /udhcpc.script -q -f -n -t 20 -T 1 >/dev/null || echo "DESKWAY no address"
deskway-nbdroot /dev/nbd0 &
i=0
while [ "$(cat /sys/block/nbd0/size)" = 0 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
ROOT=/dev/nbd0
`)
}

// DiskInitramfs builds, in dir, the initramfs of a machine whose root is
// its virtio disk (qemu's own NBD client behind it).
func DiskInitramfs(dir string) (string, error) {
	return initramfs(dir, append(baseModules, diskModules...), nil, `
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
ROOT=/dev/vda
`)
}

func initramfs(dir string, modules []string, extra map[string]string, root string) (string, error) {
	_, version, err := Kernel()
	if err != nil {
		return "", err
	}
	tree := filepath.Join(dir, "root")
	for _, d := range []string{"bin", "dev", "proc", "sys", "modules", "newroot"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return "", err
		}
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return "", fmt.Errorf("busybox (busybox-static) is needed: %w", err)
	}
	files := map[string]string{"bin/busybox": bb}
	for k, v := range extra {
		files[k] = v
	}
	var load strings.Builder
	for _, m := range modules {
		files["modules/"+filepath.Base(m)+".ko"] = filepath.Join(KernelDir, "lib", "modules", version, "kernel", m+".ko")
		fmt.Fprintf(&load, "insmod /modules/%s.ko\n", filepath.Base(m))
	}
	for dst, src := range files {
		if err := copyFile(src, filepath.Join(tree, dst)); err != nil {
			return "", err
		}
	}
	scripts := map[string]string{
		"udhcpc.script": "#!/bin/busybox sh\n[ \"$1\" = bound ] || [ \"$1\" = renew ] || exit 0\nifconfig \"$interface\" \"$ip\" netmask \"$subnet\" up\n",
		"init": "#!/bin/busybox sh\n/bin/busybox --install -s /bin\nexport PATH=/bin\nmount -t proc proc /proc\nmount -t sysfs sys /sys\nmount -t devtmpfs dev /dev\n" +
			load.String() + root + `
if ! mount -t ext4 $ROOT /newroot; then
  echo "DESKWAY root mount failed"
  poweroff -f
fi
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
`,
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(tree, name), []byte(body), 0o755); err != nil {
			return "", err
		}
	}
	out := filepath.Join(dir, "initrd.cpio")
	if b, err := exec.Command("sh", "-c", "cd "+tree+" && busybox find . | busybox cpio -o -H newc > "+out).CombinedOutput(); err != nil {
		return "", fmt.Errorf("initramfs: %v: %s", err, b)
	}
	return out, nil
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
