package netboot

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/deskway/deskway/internal/config"
)

var (
	server = net.IPv4(10, 77, 0, 1).To4()
	mac1   = net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 1}
	mac2   = net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 2}
	t0     = time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
)

// request is what a PXE client sends: a firmware's (arch given) or, with
// ipxe, iPXE's user class.
func request(t *testing.T, mac net.HardwareAddr, typ dhcpv4.MessageType, ipxe bool, arch iana.Arch, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	mods = append([]dhcpv4.Modifier{dhcpv4.WithMessageType(typ), dhcpv4.WithHwAddr(mac),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch))}, mods...)
	if ipxe {
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")))
	}
	m, err := dhcpv4.New(mods...)
	if err != nil {
		t.Fatal(err)
	}
	// Through the wire format, as the server reads it.
	if m, err = dhcpv4.FromBytes(m.ToBytes()); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestProxyAnswersPXEClientsWithBootFileOnly(t *testing.T) {
	b := boot{server: server, httpPort: 8069}
	for _, c := range []struct {
		name string
		ipxe bool
		arch iana.Arch
		want string
	}{
		{"BIOS firmware", false, iana.INTEL_X86PC, "undionly.kpxe"},
		{"UEFI firmware", false, iana.EFI_X86_64, "ipxe.efi"},
		{"iPXE", true, iana.INTEL_X86PC, "http://10.77.0.1:8069/netboot/boot.ipxe"},
	} {
		r := b.proxyReply(request(t, mac1, dhcpv4.MessageTypeDiscover, c.ipxe, c.arch))
		if r == nil || r.MessageType() != dhcpv4.MessageTypeOffer || r.BootFileName != c.want || !r.YourIPAddr.Equal(net.IPv4zero) ||
			!r.ServerIPAddr.Equal(server) || !r.ServerIdentifier().Equal(server) || r.ClassIdentifier() != "PXEClient" {
			t.Errorf("%s: proxy offer %v", c.name, r)
		}
	}
	if r := b.proxyReply(request(t, mac1, dhcpv4.MessageTypeRequest, false, iana.INTEL_X86PC)); r == nil || r.MessageType() != dhcpv4.MessageTypeAck {
		t.Errorf("port 4011 request: %v", r)
	}
	plain, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover), dhcpv4.WithHwAddr(mac1))
	if r := b.proxyReply(plain); r != nil {
		t.Errorf("a proxy answered a client that is not PXE: %v", r)
	}
}

// TestBootFileByArchitecture: in both DHCP modes, each firmware gets the
// first stage of its architecture (option 93), HTTP Boot firmware as a
// URL with class HTTPClient; a full server's PXE answers say "boot this
// file" in option 43, without which UEFI PXE asks port 4011 instead.
func TestBootFileByArchitecture(t *testing.T) {
	httpClient := dhcpv4.WithOption(dhcpv4.OptClassIdentifier("HTTPClient:Arch:00016:UNDI:003001"))
	p, err := OpenPool(filepath.Join(t.TempDir(), "leases.json"), netip.MustParseAddr("10.77.0.100"), netip.MustParseAddr("10.77.0.150"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := &full{boot: boot{server: server, httpPort: 8069}, pool: p, netmask: net.CIDRMask(24, 32)}
	for _, c := range []struct {
		name      string
		arch      iana.Arch
		http      bool
		want      string // "" for no boot file
		wantClass string
	}{
		{"BIOS", iana.INTEL_X86PC, false, "undionly.kpxe", "PXEClient"},
		{"x86-64 UEFI (7)", iana.EFI_X86_64, false, "ipxe.efi", "PXEClient"},
		{"x86-64 UEFI (9)", iana.EFI_BC, false, "ipxe.efi", "PXEClient"},
		{"arm64 UEFI", iana.EFI_ARM64, false, "ipxe-arm64.efi", "PXEClient"},
		{"x86-64 UEFI HTTP Boot", iana.EFI_X86_64_HTTP, true, "http://10.77.0.1:8069/netboot/ipxe.efi", "HTTPClient"},
		{"arm64 UEFI HTTP Boot", iana.EFI_ARM64_HTTP, true, "http://10.77.0.1:8069/netboot/ipxe-arm64.efi", "HTTPClient"},
		{"32-bit ARM UEFI", iana.EFI_ARM32, false, "", ""},
		{"RISC-V HTTP Boot", iana.EFI_RISCV64_HTTP, true, "", ""},
	} {
		var mods []dhcpv4.Modifier
		if c.http {
			mods = append(mods, httpClient)
		}
		m := request(t, mac1, dhcpv4.MessageTypeDiscover, false, c.arch, mods...)
		px := f.proxyReply(m)
		fl, err := f.reply(m, t0)
		if err != nil || fl == nil || fl.YourIPAddr.IsUnspecified() {
			t.Fatalf("%s: full DHCP answered %v, %v: an address, at least, expected", c.name, fl, err)
		}
		if c.want == "" {
			if px != nil || fl.BootFileName != "" || fl.ClassIdentifier() != "" {
				t.Errorf("%s: proxy %v, full %v: no boot file expected", c.name, px, fl)
			}
			continue
		}
		if px == nil || px.BootFileName != c.want || px.ClassIdentifier() != c.wantClass || px.Options.Has(dhcpv4.OptionVendorSpecificInformation) {
			t.Errorf("%s: proxy offer %v, want boot file %s, class %s, no option 43", c.name, px, c.want, c.wantClass)
		}
		vendor := fl.Options.Get(dhcpv4.OptionVendorSpecificInformation)
		if fl.BootFileName != c.want || fl.ClassIdentifier() != c.wantClass || c.http != (vendor == nil) || vendor != nil && string(vendor) != "\x06\x01\x08\xff" {
			t.Errorf("%s: full offer %v, want boot file %s, class %s, option 43 for PXE only", c.name, fl, c.want, c.wantClass)
		}
	}
}

func TestFullServerLeasesAndRemembers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.json")
	open := func() *full {
		p, err := OpenPool(path, netip.MustParseAddr("10.77.0.100"), netip.MustParseAddr("10.77.0.101"), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return &full{boot: boot{server: server, httpPort: 8069}, pool: p, netmask: net.CIDRMask(24, 32)}
	}
	f := open()
	lease := func(f *full, mac net.HardwareAddr) net.IP {
		t.Helper()
		o, err := f.reply(request(t, mac, dhcpv4.MessageTypeDiscover, true, iana.INTEL_X86PC), t0)
		if err != nil || o.MessageType() != dhcpv4.MessageTypeOffer || o.BootFileName != "http://10.77.0.1:8069/netboot/boot.ipxe" || o.SubnetMask().String() != "ffffff00" {
			t.Fatalf("offer: %v %v", o, err)
		}
		a, err := f.reply(request(t, mac, dhcpv4.MessageTypeRequest, true, iana.INTEL_X86PC,
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(o.YourIPAddr)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(server))), t0)
		if err != nil || a.MessageType() != dhcpv4.MessageTypeAck || !a.YourIPAddr.Equal(o.YourIPAddr) {
			t.Fatalf("ack: %v %v", a, err)
		}
		return a.YourIPAddr
	}
	// Two machines powered on together: both DISCOVERs come before
	// either REQUEST, and they are offered different addresses.
	o1, _ := f.reply(request(t, mac1, dhcpv4.MessageTypeDiscover, true, iana.INTEL_X86PC), t0)
	o2, _ := f.reply(request(t, mac2, dhcpv4.MessageTypeDiscover, true, iana.INTEL_X86PC), t0)
	if o1 == nil || o2 == nil || o1.YourIPAddr.Equal(o2.YourIPAddr) {
		t.Fatalf("concurrent offers: %v and %v", o1, o2)
	}
	ip1, ip2 := lease(f, mac1), lease(f, mac2)
	if ip1.String() != "10.77.0.100" || ip2.String() != "10.77.0.101" {
		t.Fatalf("leases %s %s", ip1, ip2)
	}
	if _, err := f.reply(request(t, net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 3}, dhcpv4.MessageTypeDiscover, false, 0), t0); err != errPoolFull {
		t.Fatalf("a third machine in a pool of two: %v", err)
	}
	// Another MAC asking for mac1's address is refused, with a reason.
	nak, _ := f.reply(request(t, net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 3}, dhcpv4.MessageTypeRequest, false, 0,
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip1))), t0)
	if nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak || !strings.Contains(nak.Message(), "leased to") {
		t.Fatalf("request for another's address: %v", nak)
	}
	// A request that chose another server's offer is not answered.
	if r, err := f.reply(request(t, mac1, dhcpv4.MessageTypeRequest, false, 0,
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip1)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 77, 0, 9)))), t0); r != nil || err != nil {
		t.Fatalf("request for another server: %v %v", r, err)
	}
	// A restarted server keeps the leases; an expired one is free again.
	f = open()
	if got := lease(f, mac2); !got.Equal(ip2) {
		t.Fatalf("after a restart mac2 got %s, want %s", got, ip2)
	}
	o, err := f.reply(request(t, net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 3}, dhcpv4.MessageTypeDiscover, false, 0), t0.Add(2*time.Hour))
	if err != nil || o.YourIPAddr.String() != "10.77.0.100" && o.YourIPAddr.String() != "10.77.0.101" {
		t.Fatalf("offer after the leases expired: %v %v", o, err)
	}
}

func TestDevicesKeepTheirRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devices.json")
	ds, err := OpenDevices(path)
	if err != nil {
		t.Fatal(err)
	}
	vdisks := []string{"golden"}
	for _, c := range []struct {
		d    Device
		want string
	}{
		{Device{MAC: "nope", Name: "pc1"}, "not an Ethernet MAC"},
		{Device{MAC: mac1.String(), Name: "../etc"}, "device name"},
		{Device{MAC: mac1.String(), Name: "pc1", VDisk: "other"}, `no vDisk "other"`},
		{Device{MAC: mac1.String(), Name: "pc1", VDisk: "golden", Stage: "beta"}, "stage"},
	} {
		if err := c.d.Check(vdisks); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.d, err, c.want)
		}
	}
	if err := ds.Add(Device{MAC: mac1.String(), Name: "pc1", VDisk: "golden", Enabled: true}); err != nil {
		t.Fatal(err)
	}
	if err := ds.Add(Device{MAC: mac1.String(), Name: "pc9"}); err == nil || !strings.Contains(err.Error(), "is device \"pc1\"") {
		t.Fatalf("a second device with one MAC: %v", err)
	}
	if err := ds.Add(Device{MAC: mac2.String(), Name: "PC1"}); err == nil {
		t.Fatal("a second device with one name (case aside)")
	}
	if _, err := ds.Update("52-54-00-77-00-01", func(d *Device) error { d.Enabled = false; return nil }); err != nil {
		t.Fatalf("update by MAC: %v", err)
	}
	again, err := OpenDevices(path)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := again.ByMAC(mac1.String()); !ok || d.Enabled || d.Name != "pc1" {
		t.Fatalf("after reopening: %+v %v", d, ok)
	}
	if err := again.Remove("pc1"); err != nil || len(again.List()) != 0 {
		t.Fatalf("remove: %v %v", err, again.List())
	}
}

func TestScripts(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	os.WriteFile(kernel, []byte("kernel bytes"), 0o644)
	st := &config.Stream{Listen: "10.77.0.1:10809", VDisks: []config.VDisk{
		{Name: "golden", Mode: "standard", Kernel: kernel, Initrd: kernel, Cmdline: "console=ttyS0"}, {Name: "bare", Mode: "private"}},
		Netboot: &config.Netboot{Interface: "br0", Address: "10.77.0.1", HTTPPort: 8069, DHCP: "proxy", Servers: []string{"10.77.0.1:10809", "10.77.0.2:10809"}}}
	s, err := New(st, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StateDir: dir, StreamPort: "10809", Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	ds := s.Devices()
	ds.Add(Device{MAC: "52:54:00:77:00:01", Name: "pc1", VDisk: "golden", Stage: "test", Enabled: true})
	ds.Add(Device{MAC: "52:54:00:77:00:02", Name: "pc2", VDisk: "golden"})
	ds.Add(Device{MAC: "52:54:00:77:00:03", Name: "pc3", VDisk: "bare", Enabled: true})
	h := s.Handler()
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	for path, want := range map[string]string{
		"/netboot/boot.ipxe":                    "#!ipxe\nchain http://10.77.0.1:8069/netboot/device?mac=${netX/mac}\n",
		"/netboot/device?mac=52:54:00:77:00:02": "echo deskway: device pc2 (52:54:00:77:00:02) is disabled by an administrator.",
		"/netboot/device?mac=52:54:00:77:00:03": "vDisk bare of device pc3 has no kernel and initrd",
		"/netboot/device?mac=52:54:00:77:00:09": "deskway device add --mac 52:54:00:77:00:09 --name NAME --vdisk VDISK",
		"/netboot/vdisks/golden/kernel":         "kernel bytes",
	} {
		if code, body := get(path); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d %q, want %q", path, code, body, want)
		}
	}
	code, body := get("/netboot/device?mac=52:54:00:77:00:01")
	if code != http.StatusOK || !strings.Contains(body, "kernel http://10.77.0.1:8069/netboot/vdisks/golden/kernel initrd=initrd console=ttyS0 deskway.device=pc1 deskway.export=golden@test/pc1/") ||
		!strings.Contains(body, "deskway.servers=10.77.0.1:10809,10.77.0.2:10809 BOOTIF=01-52-54-00-77-00-01\n") || !strings.Contains(body, "initrd --name initrd http://10.77.0.1:8069/netboot/vdisks/golden/initrd\nboot\n") {
		t.Fatalf("pc1's script: %d\n%s", code, body)
	}
	if _, again := get("/netboot/device?mac=52:54:00:77:00:01"); again == body {
		t.Fatal("two power-ons got one boot id")
	}
	for _, path := range []string{"/netboot/device?mac=nope", "/netboot/vdisks/bare/kernel", "/netboot/vdisks/golden/base", "/netboot/vdisks/none/kernel"} {
		if code, _ := get(path); code == http.StatusOK {
			t.Errorf("GET %s answered 200", path)
		}
	}
	// With auto_add, an unknown machine becomes a disabled device.
	s.cfg.AutoAdd = "lab"
	if _, body := get("/netboot/device?mac=52:54:00:77:00:0a"); !strings.Contains(body, "was added as device pxe-52540077000a in collection lab") {
		t.Fatalf("auto-add script: %s", body)
	}
	if d, ok := ds.ByMAC("52:54:00:77:00:0a"); !ok || d.Enabled || d.Collection != "lab" {
		t.Fatalf("auto-added device: %+v %v", d, ok)
	}
	// Only iPXE's first stages are served over TFTP.
	if err := s.tftpRead("../../etc/passwd", nil); err == nil {
		t.Fatal("TFTP served a path outside the iPXE files")
	}
}

// TestLeasesSurviveRestartsAndSpoofs: a renewal is written, so a
// restarted server does not give a running machine's address away; a
// RELEASE that does not name the leased address frees nothing; a lease
// outside a narrowed pool is dropped.
func TestLeasesSurviveRestartsAndSpoofs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.json")
	start, end := netip.MustParseAddr("10.77.0.100"), netip.MustParseAddr("10.77.0.100")
	p, err := OpenPool(path, start, end, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.bind(mac1.String(), start, t0); err != nil {
		t.Fatal(err)
	}
	if err := p.bind(mac1.String(), start, t0.Add(50*time.Minute)); err != nil { // a renewal
		t.Fatal(err)
	}
	p.release(mac1.String(), net.IPv4(10, 77, 0, 99)) // spoofed: not its address
	p, err = OpenPool(path, start, end, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.offer(mac2.String(), t0.Add(70*time.Minute)); err != errPoolFull {
		t.Fatalf("after a restart, the renewed lease (until %v) was offered to another machine: %v", t0.Add(110*time.Minute), err)
	}
	p.release(mac1.String(), start.AsSlice())
	if a, err := p.offer(mac2.String(), t0.Add(70*time.Minute)); err != nil || a != start {
		t.Fatalf("after a real release: %v %v", a, err)
	}
	narrow, err := OpenPool(path, netip.MustParseAddr("10.77.0.120"), netip.MustParseAddr("10.77.0.121"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := narrow.offer(mac1.String(), t0); err != nil || a.String() != "10.77.0.120" {
		t.Fatalf("offer from a narrowed pool: %v %v", a, err)
	}
}

// TestAutoAddIsBounded: machines nobody registered are added up to
// maxPending; past that they are refused, and the list stops growing.
func TestAutoAddIsBounded(t *testing.T) {
	dir := t.TempDir()
	st := &config.Stream{Listen: "10.77.0.1:10809", VDisks: []config.VDisk{{Name: "golden", Mode: "standard"}},
		Netboot: &config.Netboot{Interface: "br0", Address: "10.77.0.1", HTTPPort: 8069, DHCP: "proxy", AutoAdd: "lab"}}
	s, err := New(st, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StateDir: dir, StreamPort: "10809"})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	for i := range maxPending + 10 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", fmt.Sprintf("/netboot/device?mac=02:00:00:00:%02x:%02x", i>>8, i&0xff), nil))
		if i == maxPending+9 && !strings.Contains(rec.Body.String(), "machines already wait in collection lab") {
			t.Fatalf("past the cap: %s", rec.Body.String())
		}
	}
	if n := len(s.Devices().List()); n != maxPending {
		t.Fatalf("%d devices auto-added, want %d", n, maxPending)
	}
}
