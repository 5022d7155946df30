package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// Debian's ovmf package: the firmware, and the variable store each VM
// gets a copy of.
const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// bootUEFI starts a machine with no disk on OVMF, as a PC with UEFI
// firmware and its network card's own driver (no iPXE option ROM):
// PXE over IPv4 with httpBoot false, UEFI HTTP Boot over IPv4 with it
// true (OVMF tries PXE first, then HTTP; fw_cfg turns PXE off).
func (n *netns) bootUEFI(tap, mac string, httpBoot bool) *vm {
	n.t.Helper()
	if _, err := os.Stat(ovmfCode); err != nil {
		n.t.Fatalf("no UEFI firmware for the VM (install Debian's ovmf package; scripts/install-deps.sh does): %v", err)
	}
	vars := filepath.Join(n.t.TempDir(), "OVMF_VARS.fd")
	b, err := os.ReadFile(ovmfVars)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(vars, b, 0o600); err != nil {
		n.t.Fatal(err)
	}
	pxe := "y"
	if httpBoot {
		pxe = "n"
	}
	return n.startVM("-machine", "pc", "-m", "512",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+ovmfCode, "-drive", "if=pflash,format=raw,unit=1,file="+vars,
		"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string="+pxe, "-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n",
		"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no", "-device", "virtio-net-pci,netdev=n0,romfile=,bootindex=1,mac="+mac)
}

// startNetbootServer writes a config in dir (netbootConfig, with dhcp:
// proxy when proxy) and runs deskway in the namespace until its boot
// services listen; it returns the binary and the config's path.
func startNetbootServer(t *testing.T, ns *netns, dir string, proxy bool) (bin, cfg string) {
	t.Helper()
	kernel, initrd := netbootKit(t)
	bin = build(t)
	base := filepath.Join(dir, "golden.img")
	os.WriteFile(base, nil, 0o600)
	os.Truncate(base, 16<<20)
	conf := netbootConfig
	if proxy {
		conf = strings.Replace(conf, "    dhcp: full\n    pool: {start: 10.77.0.100, end: 10.77.0.150}\n", "    dhcp: proxy\n", 1)
	}
	cfg = filepath.Join(dir, "deskway.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(conf, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd)), 0o600)
	srv := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(srv.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the boot services did not start:\n%s", srv.Log.String())
		}
	}
	return bin, cfg
}

// TestNetbootUEFI: on a boot network where deskway is the DHCP server
// (dhcp: full), a PC with UEFI firmware (OVMF) boots over PXE (ipxe.efi
// over TFTP, then deskway's iPXE script) and another over UEFI HTTP Boot
// (ipxe.efi as a URL over HTTP), both to their vDisk's kernel and init.
func TestNetbootUEFI(t *testing.T) {
	// Beside tests that boot no guest (e2e/main_test.go); its guests take
	// both slots.
	guestTest(t)
	ns := newNetns(t, "tap1", "tap2")
	bin, cfg := startNetbootServer(t, ns, t.TempDir(), false)
	ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:11", "--name", "uefi1", "--vdisk", "golden", "-c", cfg)
	ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:12", "--name", "http1", "--vdisk", "golden", "-c", cfg)
	guests(t, 2)
	pxe, http := ns.bootUEFI("tap1", "52:54:00:77:00:11", false), ns.bootUEFI("tap2", "52:54:00:77:00:12", true)
	pxe.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.device=uefi1 deskway\.export=golden/uefi1/[0-9a-f]{16} `), 2*time.Minute)
	http.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.device=http1 deskway\.export=golden/http1/[0-9a-f]{16} `), 2*time.Minute)
	uefiBootFiles(t, pxe, http)
}

// uefiBootFiles checks what the firmware said it loaded: ipxe.efi over
// TFTP for PXE, and its URL for HTTP Boot.
func uefiBootFiles(t *testing.T, pxe, http *vm) {
	t.Helper()
	if out := pxe.out.String(); !strings.Contains(out, "NBP filename is ipxe.efi") {
		t.Errorf("the PXE VM's firmware did not load ipxe.efi:\n%s", lastLines(out, 40))
	}
	if out := http.out.String(); !strings.Contains(out, "URI: http://10.77.0.1:8069/netboot/ipxe.efi") || strings.Contains(out, "Start PXE") {
		t.Errorf("the HTTP Boot VM's firmware did not load ipxe.efi over HTTP, and only that way:\n%s", lastLines(out, 40))
	}
}

// TestNetbootUEFIProxyDHCP: beside the network's own DHCP server
// (busybox udhcpd), deskway in proxyDHCP mode gives a UEFI PC its boot
// file over PXE, and a UEFI HTTP Boot PC its boot file's URL; both boot.
func TestNetbootUEFIProxyDHCP(t *testing.T) {
	// Beside tests that boot no guest (e2e/main_test.go); its guests take
	// both slots.
	guestTest(t)
	ns := newNetns(t, "tap1", "tap2")
	dir := t.TempDir()
	conf := filepath.Join(dir, "udhcpd.conf")
	os.WriteFile(conf, []byte("start 10.77.0.50\nend 10.77.0.60\ninterface br0\nlease_file "+filepath.Join(dir, "udhcpd.leases")+"\noption subnet 255.255.255.0\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "udhcpd.leases"), nil, 0o600)
	testkit.Start(t, nil, "ip", "netns", "exec", ns.name, "busybox", "udhcpd", "-f", conf)
	bin, cfg := startNetbootServer(t, ns, dir, true)
	ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:11", "--name", "uefi1", "--vdisk", "golden", "-c", cfg)
	ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:12", "--name", "http1", "--vdisk", "golden", "-c", cfg)
	guests(t, 2)
	pxe, http := ns.bootUEFI("tap1", "52:54:00:77:00:11", false), ns.bootUEFI("tap2", "52:54:00:77:00:12", true)
	pxe.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.device=uefi1 deskway\.export=golden/uefi1/[0-9a-f]{16} `), 2*time.Minute)
	http.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.device=http1 deskway\.export=golden/http1/[0-9a-f]{16} `), 2*time.Minute)
	uefiBootFiles(t, pxe, http)
	for _, v := range []*vm{pxe, http} {
		if !regexp.MustCompile(`net0: 10\.77\.0\.(5\d|60)/`).MatchString(v.out.String()) {
			t.Errorf("the VM's address is not udhcpd's:\n%s", lastLines(v.out.String(), 40))
		}
	}
}
