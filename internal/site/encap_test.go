package site

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"testing"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/deskway/deskway/internal/config"
)

// fakeDevice hands out reads in turn (a packet, or an error) and keeps
// what is written to it.
type fakeDevice struct {
	tun.Device
	reads   []any
	written [][]byte
}

func (d *fakeDevice) BatchSize() int { return 4 }

func (d *fakeDevice) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(d.reads) == 0 {
		return 0, os.ErrClosed
	}
	r := d.reads[0]
	d.reads = d.reads[1:]
	if err, ok := r.(error); ok {
		return 0, err
	}
	sizes[0] = copy(bufs[0][offset:], r.([]byte))
	return 1, nil
}

func (d *fakeDevice) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		d.written = append(d.written, append([]byte(nil), b[offset:]...))
	}
	return len(bufs), nil
}

// recordLink keeps the packets sent to a site.
type recordLink struct{ sent [][]byte }

func (l *recordLink) Send(bufs [][]byte, offset int) error {
	for _, b := range bufs {
		l.sent = append(l.sent, append([]byte(nil), b[offset:]...))
	}
	return nil
}

func ipv4Packet(t *testing.T, src, dst string, size int, df bool) []byte {
	p := make([]byte, size)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(size))
	if df {
		p[6] = 0x40
	}
	p[8], p[9] = 64, 17
	s, _ := hex.DecodeString(src)
	d, _ := hex.DecodeString(dst)
	copy(p[12:], s)
	copy(p[16:], d)
	return p
}

// TestEncapLoop: a read the device's offload code refuses does not end
// the loop; each packet goes to the site its destination is behind, one
// to none is dropped, and one over the MTU with DF is answered with
// ICMP fragmentation needed into the device.
func TestEncapLoop(t *testing.T) {
	tn, err := newTenant(&config.Tenant{Name: "a", Key: 7, MTU: 1400, Sites: []config.TenantSite{
		{Name: "paris", Peer: "198.51.100.2", Prefixes: []string{"192.168.1.0/24"}},
		{Name: "lyon", Peer: "198.51.100.3", Prefixes: []string{"192.168.2.0/24"}},
	}}, newMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	paris, lyon := &recordLink{}, &recordLink{}
	tn.c().sites[0].link, tn.c().sites[1].link = paris, lyon
	desk := "0a00000a"
	toParis := ipv4Packet(t, desk, "c0a8010a", 100, true)
	toLyon := ipv4Packet(t, desk, "c0a8020a", 100, true)
	nowhere := ipv4Packet(t, desk, "08080808", 100, true)
	big := ipv4Packet(t, desk, "c0a8010a", 1500, true)
	bigNoDF := ipv4Packet(t, desk, "c0a8020a", 1500, false)
	dev := &fakeDevice{reads: []any{errors.New("unsupported virtio GSO type: 9"), toParis, toLyon, nowhere, big, bigNoDF}}
	tn.dev = dev
	if err := tn.encapLoop(slog.New(slog.DiscardHandler)); !errors.Is(err, errClosed) {
		t.Fatalf("the loop ended with %v, want errClosed", err)
	}
	if len(paris.sent) != 1 || string(paris.sent[0]) != string(toParis) {
		t.Fatalf("paris got %d packets, want the one to 192.168.1.10", len(paris.sent))
	}
	if len(lyon.sent) != 2 || len(lyon.sent[1]) != 1500 {
		t.Fatalf("lyon got %d packets, want the small one and the 1500 bytes without DF", len(lyon.sent))
	}
	if n := tn.m.dropCount[dropNoRoute].Load(); n != 1 {
		t.Fatalf("no_route drops %d, want 1", n)
	}
	if n := tn.m.dropCount[dropDeviceError].Load(); n != 1 {
		t.Fatalf("device_error drops %d, want 1", n)
	}
	if len(dev.written) != 1 {
		t.Fatalf("%d packets written back, want one ICMP error", len(dev.written))
	}
	icmp := dev.written[0]
	if icmp[9] != 1 || icmp[20] != 3 || icmp[21] != 4 || binary.BigEndian.Uint16(icmp[26:]) != 1400 ||
		hex.EncodeToString(icmp[12:16]) != "c0a8010a" || hex.EncodeToString(icmp[16:20]) != desk {
		t.Fatalf("the answer is not fragmentation needed (mtu 1400) from 192.168.1.10 to 10.0.0.10: %x", icmp[:28])
	}
	if sum(icmp[:20], 0) != 0xffff || sum(icmp[20:], 0) != 0xffff {
		t.Fatalf("the answer's checksums do not verify: %x", icmp[:28])
	}
}
