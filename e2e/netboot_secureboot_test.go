package e2e

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// Debian's ovmf package's Secure Boot build, and the variable store with
// Microsoft's keys enrolled (KEK and db: Microsoft's, as on a PC bought
// with Windows), Secure Boot on.
const (
	ovmfSecureCode = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"
	ovmfMSVars     = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
)

// bootSecure starts a machine with no disk on OVMF with Secure Boot
// enforced (SMM keeps the variables out of the guest's reach, as the
// secboot build requires), booting over PXE from its NIC's own driver.
func (n *netns) bootSecure(tap, mac string) *vm {
	n.t.Helper()
	for _, f := range []string{ovmfSecureCode, ovmfMSVars} {
		if _, err := os.Stat(f); err != nil {
			n.t.Fatalf("no Secure Boot firmware for the VM (install Debian's ovmf package; scripts/install-deps.sh does): %v", err)
		}
	}
	vars := filepath.Join(n.t.TempDir(), "OVMF_VARS.fd")
	b, err := os.ReadFile(ovmfMSVars)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(vars, b, 0o600); err != nil {
		n.t.Fatal(err)
	}
	return n.startVM("-machine", "q35,smm=on", "-global", "driver=cfi.pflash01,property=secure,value=on", "-m", "768",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmfSecureCode, "-drive", "if=pflash,format=raw,unit=1,file="+vars,
		"-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n",
		"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no", "-device", "virtio-net-pci,netdev=n0,romfile=,bootindex=1,mac="+mac)
}

// secureBootConfig is netbootRootConfig with the signed chain on.
func secureBootConfig(proxy bool) string {
	c := strings.Replace(netbootRootConfig, "    dhcp: full\n", "    secure_boot: true\n    dhcp: full\n", 1)
	if proxy {
		c = strings.Replace(c, "    dhcp: full\n    pool: {start: 10.77.0.100, end: 10.77.0.150}\n", "    dhcp: proxy\n", 1)
	}
	return c
}

// secureRootImage is a vDisk whose init says whether the kernel booted
// with Secure Boot on and in lockdown, and what it was given.
func secureRootImage(t *testing.T, path string) {
	t.Helper()
	vdiskWithInit(t, path, map[string]string{"golden.txt": "golden image v1\n"}, `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null || { mount -t sysfs sysfs /sys && mount -t securityfs securityfs /sys/kernel/security; }
echo "DESKWAY secure: $(dmesg | grep -o 'Secure boot [a-z]*' | head -1); lockdown: $(cat /sys/kernel/security/lockdown)"
echo "DESKWAY root: $(cat /golden.txt) personality: $(tr '\n' ' ' </etc/deskway/personality)"
echo "DESKWAY cmdline: $(cat /proc/cmdline)"
poweroff -f
`)
}

// startSecureBootServer runs deskway in ns with conf (netbootRootConfig's
// placeholders) and a vDisk booting to secureRootImage's init.
func startSecureBootServer(t *testing.T, ns *netns, conf string) (bin, cfg string, srv *testkit.Process) {
	t.Helper()
	kernel, initrd := netbootRootKit(t)
	bin = build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	secureRootImage(t, base)
	cfg = filepath.Join(dir, "deskway.yaml")
	writeFile(t, cfg, fmt.Sprintf(conf, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd))
	srv = testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(srv.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the boot services did not start:\n%s", srv.Log.String())
		}
	}
	return bin, cfg, srv
}

// TestNetbootSecureBoot: PCs with UEFI Secure Boot enforced and only
// Microsoft's keys enrolled (Debian's OVMF) boot from deskway with
// secure_boot on, through shim, GRUB and Debian's kernel, all signed,
// to their vDisk's init over NBD, with deskway's DHCP server (full)
// and beside the network's own (proxy); the kernel says it booted with
// Secure Boot on and is in lockdown. A disabled device is told so by
// GRUB and boots once enabled. No MOK is enrolled: the firmware
// variables are Debian's as shipped. The same firmware refuses the
// iPXE deskway sends without secure_boot.
//
// Its three machines boot beside each other, holding both guest slots
// (e2e/main_test.go): 209 s for the three (their own times add up to
// 556 s), all emulated (TCG); they passed so at a load average of 25 on
// two cores.
func TestNetbootSecureBoot(t *testing.T) {
	guestTest(t)
	guests(t, 2) // released once its three cases have ended
	t.Run("full", func(t *testing.T) {
		t.Parallel()
		ns := newNetns(t, "tap1")
		bin, cfg, srv := startSecureBootServer(t, ns, secureBootConfig(false))
		ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:21", "--name", "sb1", "--vdisk", "golden", "--disabled", "-c", cfg)
		ns.run(bin, "device", "personality", "sb1", "role=kiosk", "site=north", "-c", cfg)
		// Disabled, GRUB says so and asks again; enabled, Esc (or the
		// minute's end) and it boots, with no power cycle.
		v := ns.bootSecure("tap1", "52:54:00:77:00:21")
		v.wait(t, regexp.MustCompile(`deskway: device sb1 \(52:54:00:77:00:21\) is disabled by an administrator\.`), 10*time.Minute)
		ns.run(bin, "device", "enable", "sb1", "-c", cfg)
		io.WriteString(v.in, "\x1b")
		checkSecureBoot(t, v, "sb1", srv, `Station IP address is 10\.77\.0\.1[0-5]\d\b`)
	})
	t.Run("proxy", func(t *testing.T) {
		t.Parallel()
		ns := newNetns(t, "tap1")
		dir := t.TempDir()
		conf := filepath.Join(dir, "udhcpd.conf")
		// GRUB reads its TFTP server from the network's DHCP answer
		// (next-server), not from deskway's proxy offer: the network's
		// DHCP server names deskway there (docs/netboot.md).
		writeFile(t, conf, "start 10.77.0.50\nend 10.77.0.60\ninterface br0\nlease_file "+filepath.Join(dir, "udhcpd.leases")+"\noption subnet 255.255.255.0\nsiaddr 10.77.0.1\n")
		writeFile(t, filepath.Join(dir, "udhcpd.leases"), "")
		testkit.Start(t, nil, "ip", "netns", "exec", ns.name, "busybox", "udhcpd", "-f", conf)
		bin, cfg, srv := startSecureBootServer(t, ns, secureBootConfig(true))
		ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:22", "--name", "sb2", "--vdisk", "golden", "-c", cfg)
		ns.run(bin, "device", "personality", "sb2", "role=kiosk", "site=north", "-c", cfg)
		checkSecureBoot(t, ns.bootSecure("tap1", "52:54:00:77:00:22"), "sb2", srv, `Station IP address is 10\.77\.0\.(5\d|60)\b`)
	})
	// The negative control: without secure_boot, the same firmware is
	// sent ipxe.efi and refuses it.
	t.Run("ipxe refused", func(t *testing.T) {
		t.Parallel()
		ns := newNetns(t, "tap1")
		bin, cfg, _ := startSecureBootServer(t, ns, netbootRootConfig)
		ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:23", "--name", "sb3", "--vdisk", "golden", "-c", cfg)
		v := ns.bootSecure("tap1", "52:54:00:77:00:23")
		v.wait(t, regexp.MustCompile(`NBP filename is ipxe\.efi(?s:.*)BdsDxe: failed to load Boot\d+ "UEFI PXEv4 \(MAC:525400770023\)".*: Access Denied`), 2*time.Minute)
		if strings.Contains(v.out.String(), "iPXE") {
			t.Fatalf("iPXE ran under Secure Boot:\n%s", lastLines(v.out.String(), 40))
		}
	})
}

// checkSecureBoot waits for v, device dev, to reach its vDisk's init
// through the signed chain, with an address whose console line matches
// addr, and checks what the init saw: Secure Boot on, the kernel in
// lockdown, its root disk over NBD, the command line and personality
// the iPXE path gives. Shim never asked for MokManager: no key had to
// be enrolled.
func checkSecureBoot(t *testing.T, v *vm, dev string, srv *testkit.Process, addr string) {
	t.Helper()
	secure := v.wait(t, regexp.MustCompile(`DESKWAY secure: ([^\r\n]*)[\r\n]`), 10*time.Minute)[1]
	if !strings.HasPrefix(secure, "Secure boot enabled; lockdown: ") || !strings.Contains(secure, "[integrity]") {
		t.Errorf("%s's kernel: %q, want Secure Boot enabled and lockdown integrity", dev, secure)
	}
	root := v.wait(t, regexp.MustCompile(`DESKWAY root: ([^\r\n]*)[\r\n]`), time.Minute)[1]
	if strings.TrimSpace(root) != "golden image v1 personality: role=kiosk site=north" {
		t.Errorf("%s's root disk: %q", dev, root)
	}
	cmdline := v.wait(t, regexp.MustCompile(`DESKWAY cmdline: ([^\r\n]*)[\r\n]`), time.Minute)[1]
	want := regexp.MustCompile(`^BOOT_IMAGE=\(tftp,10\.77\.0\.1\)/netboot/vdisks/golden/kernel console=ttyS0 panic=-1 quiet deskway\.device=` + dev +
		` deskway\.export=golden/` + dev + `/[0-9a-f]{16} deskway\.mode=standard deskway\.servers=10\.77\.0\.1:10809 BOOTIF=01-52-54-00-77-00-2\d deskway\.p\.role=kiosk deskway\.p\.site=north\s*$`)
	if !want.MatchString(cmdline) {
		t.Errorf("%s's kernel command line: %q, want %s", dev, cmdline, want)
	}
	out := strings.ReplaceAll(v.out.String(), "\r", "")
	for _, re := range []string{`NBP filename is shimx64\.efi`, `Fetching Netboot Image grubx64\.efi`, `deskway: device ` + dev + ` boots vDisk golden`, addr} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("%s's console lacks %s:\n%s", dev, re, lastLines(out, 40))
		}
	}
	for _, f := range []string{"mmx64.efi", "ipxe.efi"} {
		if strings.Contains(srv.Log.String(), "file="+f) {
			t.Errorf("%s asked for %s:\n%s", dev, f, lastLines(srv.Log.String(), 40))
		}
	}
}
