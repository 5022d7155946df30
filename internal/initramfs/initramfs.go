// Package initramfs builds the initramfs deskway serves a network-booted
// machine: a static busybox, deskway-nbdroot, the kernel modules of the
// machine's network card, of NBD and of its root file system, and an
// /init that brings up the card the machine booted from over DHCP,
// connects the vDisk's export with the kernel's NBD driver, mounts it and
// hands over to the vDisk's own /sbin/init.
package initramfs

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/cavaliergopher/cpio"
)

// DefaultDrivers are the network cards' drivers an initramfs carries when
// the kernel has them: virtual machines' and the common server and
// desktop cards'. A card missing here is added with Options.Drivers.
var DefaultDrivers = []string{"virtio_pci", "virtio_net", "e1000", "e1000e", "igb", "igc", "ixgbe", "i40e", "ice",
	"r8169", "tg3", "bnx2", "bnxt_en", "vmxnet3", "hv_netvsc"}

// Options say what goes into a network-boot initramfs.
type Options struct {
	// Modules is the module tree of the kernel the vDisk boots
	// (/lib/modules/VERSION).
	Modules string
	// Nbdroot is the deskway-nbdroot program, and Busybox a statically
	// linked busybox (Debian's busybox-static).
	Nbdroot, Busybox string
	// FSType is the root file system's type, and its module's name
	// (ext4 unless set).
	FSType string
	// Drivers are more network card drivers, beside DefaultDrivers.
	Drivers []string
}

// Build writes the initramfs to w as a newc cpio archive, the format the
// kernel unpacks, and returns the modules it holds in load order.
func Build(w io.Writer, o Options) ([]Module, error) {
	if o.FSType == "" {
		o.FSType = "ext4"
	}
	mods, err := Resolve(o.Modules, []string{"nbd", o.FSType}, append(slices.Clone(DefaultDrivers), o.Drivers...))
	if err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(mods, func(m Module) bool {
		return slices.Contains(DefaultDrivers, m.Name) || slices.Contains(o.Drivers, m.Name)
	}) {
		return nil, fmt.Errorf("initramfs: %s has none of the network drivers %s: name the machines' with --driver", o.Modules, strings.Join(append(DefaultDrivers, o.Drivers...), ", "))
	}
	for _, p := range []struct{ what, path string }{{"busybox", o.Busybox}, {"deskway-nbdroot", o.Nbdroot}} {
		if err := static(p.path); err != nil {
			return nil, fmt.Errorf("initramfs: %s: %w", p.what, err)
		}
	}
	files := []File{
		{Name: "bin/busybox", Source: o.Busybox, Mode: 0o755},
		{Name: "bin/deskway-nbdroot", Source: o.Nbdroot, Mode: 0o755},
		{Name: "init", Data: []byte(strings.ReplaceAll(initScript, "FSTYPE", o.FSType)), Mode: 0o755},
		{Name: "udhcpc.script", Data: []byte(udhcpcScript), Mode: 0o755},
	}
	files = append(files, ModuleFiles(mods)...)
	for _, d := range []string{"dev", "proc", "sys", "newroot"} {
		files = append(files, File{Name: d, Mode: os.ModeDir | 0o755})
	}
	return mods, Write(w, files)
}

// ModuleFiles puts mods under /modules with /modules/order, the names in
// load order, which the /init scripts insmod one by one.
func ModuleFiles(mods []Module) []File {
	var files []File
	var order strings.Builder
	for _, m := range mods {
		files = append(files, File{Name: "modules/" + m.Name + ".ko", Module: m.Path, Mode: 0o644})
		order.WriteString(m.Name + "\n")
	}
	return append(files, File{Name: "modules/order", Data: []byte(order.String()), Mode: 0o644})
}

// static says whether the program at p runs with no dynamic loader, as it
// must in an initramfs that has none.
func static(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; an initramfs needs a static one (Debian's busybox-static; make build's deskway-nbdroot)", p)
		}
	}
	return nil
}

// File is one entry of an archive: a directory (Mode has os.ModeDir), or
// a file with Data, the contents of Source, or the kernel module at
// Module, decompressed.
type File struct {
	Name   string // inside the archive, no leading slash
	Mode   os.FileMode
	Data   []byte
	Source string
	Module string
}

// Write writes files to w as a newc cpio archive, adding the directories
// their names need.
func Write(w io.Writer, files []File) error {
	cw := cpio.NewWriter(w)
	made := map[string]bool{".": true}
	var mkdir func(d string) error
	mkdir = func(d string) error {
		if made[d] {
			return nil
		}
		if err := mkdir(path.Dir(d)); err != nil {
			return err
		}
		made[d] = true
		return cw.WriteHeader(&cpio.Header{Name: d, Mode: cpio.TypeDir | 0o755, Links: 2, ModTime: time.Unix(0, 0)})
	}
	for _, f := range files {
		if f.Mode.IsDir() {
			if err := mkdir(f.Name); err != nil {
				return err
			}
			continue
		}
		if err := mkdir(path.Dir(f.Name)); err != nil {
			return err
		}
		data := f.Data
		var err error
		switch {
		case f.Source != "":
			if data, err = os.ReadFile(f.Source); err != nil {
				return fmt.Errorf("initramfs: %w", err)
			}
		case f.Module != "":
			if data, err = ReadModule(f.Module); err != nil {
				return err
			}
		}
		h := &cpio.Header{Name: f.Name, Mode: cpio.TypeReg | cpio.FileMode(f.Mode.Perm()), Links: 1, Size: int64(len(data)), ModTime: time.Unix(0, 0)}
		if err := cw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := cw.Write(data); err != nil {
			return err
		}
	}
	return cw.Close()
}

// udhcpcScript configures the address udhcpc leased, and the default
// route when the lease names one.
const udhcpcScript = `#!/bin/busybox sh
[ "$1" = bound ] || [ "$1" = renew ] || exit 0
ifconfig "$interface" "$ip" netmask "$subnet" up
if [ -n "$router" ]; then
  route del default 2>/dev/null
  route add default gw "${router%% *}" dev "$interface"
fi
`

// initScript brings up the card the machine booted from (BOOTIF, which
// deskway's boot script puts on the command line; else the first card),
// connects the root disk and switches to it. A machine that cannot is
// rebooted after 10 s, so its firmware tries the network boot again.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() { echo "deskway: $*; rebooting in 10 s"; sleep 10; reboot -f; }
for m in $(cat /modules/order); do insmod /modules/$m.ko 2>/dev/null; done
want=$(sed -n 's/.*BOOTIF=01-\([0-9a-fA-F-]*\).*/\1/p' /proc/cmdline | tr 'A-F-' 'a-f:')
dev=
i=0
while [ -z "$dev" ] && [ $i -lt 100 ]; do
  for n in /sys/class/net/*; do
    [ "$(cat $n/type)" = 1 ] || continue
    if [ -z "$want" ] || [ "$(cat $n/address)" = "$want" ]; then dev=${n##*/}; break; fi
  done
  [ -n "$dev" ] || sleep 0.1
  i=$((i+1))
done
[ -n "$dev" ] || fail "no network card${want:+ with address $want} (is its driver in the initramfs?)"
ip link set "$dev" up
# udhcpc stays, in the background, to renew the lease: an address whose
# lease ran out would be given to another machine.
udhcpc -i "$dev" -s /udhcpc.script -n -t 20 -T 1 >/dev/null || fail "no DHCP lease on $dev"
deskway-nbdroot /dev/nbd0 &
nbdroot=$!
i=0
while [ "$(cat /sys/block/nbd0/size)" = 0 ] && [ $i -lt 1500 ]; do
  kill -0 $nbdroot 2>/dev/null || fail "deskway-nbdroot ended without a root disk"
  sleep 0.1; i=$((i+1))
done
mount -t FSTYPE /dev/nbd0 /newroot || fail "root disk not mounted"
# The device's personality (deskway.p.KEY=VALUE), for the system to read:
# KEY=VALUE lines, the file emptied when the device has none.
if mkdir -p /newroot/etc/deskway 2>/dev/null; then
  tr ' ' '\n' </proc/cmdline | sed -n 's/^deskway\.p\.//p' >/newroot/etc/deskway/personality || echo "deskway: the personality could not be written"
fi
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
`
