package netboot

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/deskway/deskway/internal/config"
)

// TestSecureBootFirstStage: with secure_boot, x86-64 UEFI PXE firmware
// (either reading of option 93) is sent shim in both DHCP modes; BIOS,
// arm64, HTTP Boot and iPXE itself get what they get without it.
func TestSecureBootFirstStage(t *testing.T) {
	p, err := OpenPool(filepath.Join(t.TempDir(), "leases.json"), netip.MustParseAddr("10.77.0.100"), netip.MustParseAddr("10.77.0.150"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b := boot{server: server, httpPort: 8069, secureBoot: true}
	f := &full{boot: b, pool: p, netmask: net.CIDRMask(24, 32)}
	httpClient := dhcpv4.WithOption(dhcpv4.OptClassIdentifier("HTTPClient:Arch:00016:UNDI:003001"))
	for _, c := range []struct {
		name string
		m    *dhcpv4.DHCPv4
		want string
	}{
		{"x86-64 UEFI (7)", request(t, mac1, dhcpv4.MessageTypeDiscover, false, iana.EFI_X86_64), "shimx64.efi"},
		{"x86-64 UEFI (9)", request(t, mac1, dhcpv4.MessageTypeDiscover, false, iana.EFI_BC), "shimx64.efi"},
		{"BIOS", request(t, mac1, dhcpv4.MessageTypeDiscover, false, iana.INTEL_X86PC), "undionly.kpxe"},
		{"arm64 UEFI", request(t, mac1, dhcpv4.MessageTypeDiscover, false, iana.EFI_ARM64), "ipxe-arm64.efi"},
		{"x86-64 HTTP Boot", request(t, mac1, dhcpv4.MessageTypeDiscover, false, iana.EFI_X86_64_HTTP, httpClient), "http://10.77.0.1:8069/netboot/ipxe.efi"},
		{"iPXE", request(t, mac1, dhcpv4.MessageTypeDiscover, true, iana.EFI_X86_64), "http://10.77.0.1:8069/netboot/boot.ipxe"},
	} {
		px := b.proxyReply(c.m)
		fl, err := f.reply(c.m, t0)
		if px == nil || px.BootFileName != c.want || err != nil || fl.BootFileName != c.want {
			t.Errorf("%s: proxy %v, full %v (%v), want boot file %s", c.name, px, fl, err, c.want)
		}
	}
}

// TestSecureBootFiles: with secure_boot, TFTP serves shim, GRUB under the
// name shim asks for, GRUB's configuration, and each machine's own,
// which says in GRUB's words what its iPXE script says: boot the vDisk's
// kernel with the same command line (iPXE's initrd= left out), or why
// not, and ask again. Without secure_boot none of it is served.
func TestSecureBootFiles(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"vmlinuz": "kernel bytes", "initrd": "initrd bytes", "shim": "shim bytes", "grub": "grub bytes"}
	for name, body := range files {
		os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644)
	}
	st := &config.Stream{Listen: "10.77.0.1:10809", VDisks: []config.VDisk{
		{Name: "golden", Mode: "standard", Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd"), Cmdline: "console=ttyS0"}},
		Netboot: &config.Netboot{Interface: "br0", Address: "10.77.0.1", HTTPPort: 8069, DHCP: "proxy", SecureBoot: true,
			Shim: filepath.Join(dir, "shim"), Grub: filepath.Join(dir, "grub")}}
	s, err := New(st, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StateDir: dir, StreamPort: "10809", Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	s.Devices().Add(Device{MAC: "52:54:00:77:00:01", Name: "pc1", VDisk: "golden", Enabled: true, Personality: map[string]string{"role": "kiosk"}})
	s.Devices().Add(Device{MAC: "52:54:00:77:00:02", Name: "pc2", VDisk: "golden"})
	read := func(name string) (string, error) {
		var b bytes.Buffer
		err := s.tftpRead(name, &b)
		return b.String(), err
	}
	for name, want := range map[string]string{
		"shimx64.efi":                   "shim bytes",
		"grubx64.efi":                   "grub bytes",
		"/grub/grub.cfg":                "while true; do\n  source (tftp,10.77.0.1)/grub/device-${net_default_mac}.cfg\n  sleep --interruptible 60\ndone\n",
		"netboot/vdisks/golden/kernel":  "kernel bytes",
		"/netboot/vdisks/golden/initrd": "initrd bytes",
		"grub/device-52:54:00:77:00:02.cfg": "echo 'deskway: device pc2 (52:54:00:77:00:02) is disabled by an administrator.'\n" +
			"echo 'deskway: It boots again after: deskway device enable pc2'\n" +
			"echo 'Press Esc to try again now'\n",
	} {
		if got, err := read(name); err != nil || got != want {
			t.Errorf("TFTP %s: %q, %v; want %q", name, got, err, want)
		}
	}
	got, err := read("grub/device-52:54:00:77:00:01.cfg")
	want := regexp.MustCompile(`^echo 'deskway: device pc1 boots vDisk golden \(boot [0-9a-f]{16}\)'\n` +
		`linux \(tftp,10\.77\.0\.1\)/netboot/vdisks/golden/kernel console=ttyS0 deskway\.device=pc1 deskway\.export=golden/pc1/[0-9a-f]{16} deskway\.mode=standard deskway\.servers=10\.77\.0\.1:10809 BOOTIF=01-52-54-00-77-00-01 deskway\.p\.role=kiosk\n` +
		`initrd \(tftp,10\.77\.0\.1\)/netboot/vdisks/golden/initrd\nboot\n$`)
	if err != nil || !want.MatchString(got) {
		t.Errorf("pc1's GRUB configuration: %v\n%s", err, got)
	}
	if got, err := read("grub/device-nope.cfg"); err != nil || !strings.Contains(got, "echo 'deskway: this machine (nope) cannot be booted through Secure Boot") {
		t.Errorf("a MAC that is not one: %q, %v; want the reason on its console", got, err)
	}
	for _, name := range []string{"netboot/vdisks/golden/base", "netboot/vdisks/../../etc/passwd", "grub/x86_64-efi/grub.cfg", "mmx64.efi"} {
		if got, err := read(name); err == nil {
			t.Errorf("TFTP %s served %q", name, got)
		}
	}
	s.cfg.SecureBoot = false
	for _, name := range []string{"shimx64.efi", "grubx64.efi", "grub/grub.cfg", "netboot/vdisks/golden/kernel"} {
		if got, err := read(name); err == nil {
			t.Errorf("without secure_boot, TFTP %s served %q", name, got)
		}
	}
}

// TestIPXEToGrubRefusesWhatItDoesNotKnow: a step of an iPXE script with
// no GRUB equivalent here fails the translation rather than vanish.
func TestIPXEToGrubRefusesWhatItDoesNotKnow(t *testing.T) {
	for _, script := range []string{"#!ipxe\nmenu Choose\n", "#!ipxe\nkernel http://elsewhere/vmlinuz\n", "#!ipxe\nprompt Press a key\n"} {
		if got, err := ipxeToGrub(script, "http://10.77.0.1:8069", "(tftp,10.77.0.1)"); err == nil {
			t.Errorf("%q translated to %q", script, got)
		}
	}
	if got, _ := ipxeToGrub("echo it's\n", "", ""); !strings.Contains(got, `echo 'it'\''s'`) {
		t.Errorf("a quote in an echo: %q", got)
	}
}
