package x224

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/proto/x224/x224test"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The Connection Request and Confirm of MS-RDPBCGR's annotated example
// (4.1.1 and 4.1.2).
const (
	specRequest = `0300002c 27 e0 0000 0000 00 436f6f6b69653a206d737473686173683d656c746f6e730d0a 01 00 0800 00000000`
	specConfirm = `03000013 0e d0 0000 1234 00 02 00 0800 00000000`
)

func TestConnectionRequest(t *testing.T) {
	cr, err := ParseConnectionRequest(unhex(t, specRequest))
	if err != nil {
		t.Fatal(err)
	}
	if !cr.HasNeg || cr.Protocols != ProtocolRDP {
		t.Errorf("got %+v", cr)
	}
	// What IronRDP's web client sends without CredSSP: TLS only, no cookie.
	tlsOnly := unhex(t, `03000013 0e e0 0000 0000 00 01 00 0800 01000000`)
	if cr, err := ParseConnectionRequest(tlsOnly); err != nil || cr.Protocols != ProtocolSSL {
		t.Errorf("got %+v, %v", cr, err)
	}
	for name, bad := range map[string]string{
		"a confirm":        specConfirm,
		"length too long":  `03000014 0e e0 0000 0000 00 01 00 0800 01000000`,
		"LI disagrees":     `03000013 0f e0 0000 0000 00 01 00 0800 01000000`,
		"not TPKT":         `16030100 0e e0 0000 0000 00 01 00 0800 01000000`,
		"garbage neg part": `03000010 0b e0 0000 0000 00 01 02 03 04`,
	} {
		if _, err := ParseConnectionRequest(unhex(t, bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestConnectionConfirm(t *testing.T) {
	cc, err := ParseConnectionConfirm(unhex(t, specConfirm))
	if err != nil || cc.Protocol != ProtocolRDP || cc.Failure != 0 {
		t.Fatalf("got %+v, %v", cc, err)
	}
	cc, err = ParseConnectionConfirm(unhex(t, `03000013 0e d0 0000 1234 00 02 1f 0800 01000000`))
	if err != nil || cc.Protocol != ProtocolSSL {
		t.Fatalf("got %+v, %v", cc, err)
	}
	// SSL_NOT_ALLOWED_BY_SERVER (2).
	cc, err = ParseConnectionConfirm(unhex(t, `03000013 0e d0 0000 1234 00 03 00 0800 02000000`))
	if err != nil || cc.Failure != 2 {
		t.Fatalf("got %+v, %v", cc, err)
	}
	if _, err := ParseConnectionConfirm(unhex(t, specRequest)); err == nil {
		t.Error("a request parsed as a confirm")
	}
}

func TestTPKTLen(t *testing.T) {
	if n, err := TPKTLen([]byte{3, 0, 1}); n != 0 || err != nil {
		t.Errorf("short header: %d, %v", n, err)
	}
	if n, err := TPKTLen([]byte{3, 0, 0x01, 0x02}); n != 258 || err != nil {
		t.Errorf("got %d, %v", n, err)
	}
	if _, err := TPKTLen([]byte{3, 0, 0, 4}); err == nil {
		t.Error("accepted a TPKT with room for no X.224 header")
	}
	if _, err := TPKTLen([]byte{0x44, 0, 0, 40}); err == nil {
		t.Error("accepted a fast-path byte as TPKT")
	}
}

// clientInfo builds a Client Info PDU as a client sends it under TLS:
// TPKT, X.224 Data, MCS Send Data Request on the I/O channel, the basic
// security header with SEC_INFO_PKT, then TS_INFO_PACKET.
func clientInfo(flags uint32, extra int) []byte {
	info := binary.LittleEndian.AppendUint32(nil, 0x0409)
	info = binary.LittleEndian.AppendUint32(info, flags)
	info = append(info, make([]byte, extra)...)
	user := append([]byte{0x40, 0x00, 0x00, 0x00}, info...)
	mcs := []byte{0x64, 0x00, 0x06, 0x03, 0xeb, 0x70}
	if len(user) < 0x80 {
		mcs = append(mcs, byte(len(user)))
	} else {
		mcs = append(mcs, 0x80|byte(len(user)>>8), byte(len(user)))
	}
	body := append(append([]byte{0x02, 0xf0, 0x80}, mcs...), user...)
	return append([]byte{3, 0, byte((len(body) + 4) >> 8), byte(len(body) + 4)}, body...)
}

func TestSetAutoLogon(t *testing.T) {
	for _, extra := range []int{0, 100, 600} {
		pkt := clientInfo(0x00000100|0x00000002, extra)
		ok, err := SetAutoLogon(pkt)
		if err != nil || !ok {
			t.Fatalf("extra %d: %v, %v", extra, ok, err)
		}
		want := clientInfo(0x00000100|0x00000002|InfoAutoLogon, extra)
		if !bytes.Equal(pkt, want) {
			t.Fatalf("extra %d: got\n%x\nwant\n%x", extra, pkt, want)
		}
	}
	// A hand-checked vector: flags 0x00000133 become 0x0000013b.
	pkt := unhex(t, `0300001a 02f080 64 0006 03eb 70 0c 40000000 09040000 33010000`)
	if ok, err := SetAutoLogon(pkt); !ok || err != nil {
		t.Fatalf("%v, %v", ok, err)
	}
	if want := unhex(t, `0300001a 02f080 64 0006 03eb 70 0c 40000000 09040000 3b010000`); !bytes.Equal(pkt, want) {
		t.Fatalf("got %x", pkt)
	}
}

func TestSetAutoLogonLeavesOthers(t *testing.T) {
	for name, s := range map[string]string{
		// Erect Domain Request and Attach User Request.
		"erect domain": `0300000c 02f080 04 01 00 01 00`,
		"attach user":  `03000008 02f080 28`,
		// A Send Data Request without SEC_INFO_PKT (a Confirm Active's
		// share control header instead).
		"other data": `0300001a 02f080 64 0006 03eb 70 0c 13000000 09040000 33010000`,
		"request":    specRequest,
	} {
		pkt := unhex(t, s)
		orig := bytes.Clone(pkt)
		if ok, err := SetAutoLogon(pkt); ok || err != nil || !bytes.Equal(pkt, orig) {
			t.Errorf("%s: %v, %v, changed %v", name, ok, err, !bytes.Equal(pkt, orig))
		}
	}
	// An MCS length that disagrees with the packet is an error.
	pkt := unhex(t, `0300001a 02f080 64 0006 03eb 70 0d 40000000 09040000 33010000`)
	if _, err := SetAutoLogon(pkt); err == nil {
		t.Error("accepted an MCS length that disagrees with the packet")
	}
}

// FuzzSetAutoLogon: whatever the packet, at most the one flag bit
// changes, and only when SetAutoLogon says so.
func FuzzSetAutoLogon(f *testing.F) {
	f.Add(clientInfo(0x133, 0))
	f.Add(clientInfo(0x133, 300))
	f.Add(unhex(f, specRequest))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		orig := bytes.Clone(pkt)
		ok, err := SetAutoLogon(pkt)
		diff := 0
		for i := range pkt {
			if pkt[i] != orig[i] {
				diff++
				if pkt[i]^orig[i] != InfoAutoLogon {
					t.Fatalf("byte %d changed from %02x to %02x", i, orig[i], pkt[i])
				}
			}
		}
		if (err != nil || !ok) && diff > 0 {
			t.Fatalf("changed %d bytes but returned %v, %v", diff, ok, err)
		}
		_, _ = ParseConnectionRequest(orig)
		_, _ = ParseConnectionConfirm(orig)
	})
}

// connectInitialWith is an MCS Connect Initial with clientName in the
// core data and the given channels in the network data.
func connectInitialWith(clientName []byte, channels ...string) []byte {
	return x224test.ConnectInitial(0, clientName, channels...)
}

func connectInitial(channels ...string) []byte { return connectInitialWith(nil, channels...) }

func TestDisableChannels(t *testing.T) {
	pkt := connectInitial("rdpdr", "rdpsnd", "cliprdr", "drdynvc")
	ci, n, err := DisableChannels(pkt, []string{"CLIPRDR", "rdpdr"})
	if err != nil || !ci || n != 2 {
		t.Fatalf("connect initial %v, renamed %d, %v", ci, n, err)
	}
	if want := connectInitial("_dpdr", "rdpsnd", "_liprdr", "drdynvc"); !bytes.Equal(pkt, want) {
		t.Fatalf("got\n%x\nwant\n%x", pkt, want)
	}
	// A packet that is not a Connect Initial stays as it is.
	for _, p := range [][]byte{unhex(t, specRequest), clientInfo(0x133, 40)} {
		orig := bytes.Clone(p)
		if ci, n, err := DisableChannels(p, []string{"cliprdr"}); ci || n != 0 || err != nil || !bytes.Equal(p, orig) {
			t.Errorf("changed a packet that is no Connect Initial: %v %d, %v", ci, n, err)
		}
	}
}

// TestChannelIndex: the clipboard channel's place among those the
// client asks for, after any the policy withheld (renamed) before it.
func TestChannelIndex(t *testing.T) {
	for _, c := range []struct {
		pkt  []byte
		want int
	}{
		{connectInitial("rdpdr", "rdpsnd", "cliprdr", "drdynvc"), 2},
		{connectInitial("_liprdr", "drdynvc"), -1},
		{connectInitial("drdynvc", "CLIPRDR"), 1},
	} {
		if i, ci, err := ChannelIndex(c.pkt, "cliprdr"); i != c.want || !ci || err != nil {
			t.Errorf("ChannelIndex = %d %v %v, want %d", i, ci, err, c.want)
		}
	}
	if i, ci, err := ChannelIndex(unhex(t, specRequest), "cliprdr"); i != -1 || ci || err != nil {
		t.Errorf("a Connection Request: ChannelIndex = %d %v %v", i, ci, err)
	}
}

// TestDisableChannelsIgnoresDecoys: a network-data header hidden in a
// field the host ignores (the client name) does not stop the real
// channel list from being found: the blocks are walked, not scanned.
func TestDisableChannelsIgnoresDecoys(t *testing.T) {
	decoy := []byte{0x03, 0xc0, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00}
	pkt := connectInitialWith(decoy, "rdpdr", "cliprdr")
	if _, n, err := DisableChannels(pkt, []string{"cliprdr"}); n != 1 || err != nil {
		t.Fatalf("renamed %d, %v", n, err)
	}
	if !bytes.Equal(pkt, connectInitialWith(decoy, "rdpdr", "_liprdr")) {
		t.Fatal("the real channel list was not changed")
	}
}

// TestDisableChannelsRefusesBadStructure: a Connect Initial whose lengths
// do not add up is an error, so the caller does not pass it on unchecked.
func TestDisableChannelsRefusesBadStructure(t *testing.T) {
	good := connectInitial("cliprdr")
	for name, mutate := range map[string]func([]byte){
		"block longer than the data": func(p []byte) { p[len(p)-12-8+2] = 0xff },
		"channel count off by one":   func(p []byte) { p[len(p)-12-4]++ },
		"BER length too long":        func(p []byte) { p[4+3+3]++ },
	} {
		p := bytes.Clone(good)
		mutate(p)
		if ci, _, err := DisableChannels(p, []string{"cliprdr"}); err == nil {
			t.Errorf("%s: accepted (connect initial %v)", name, ci)
		}
	}
}

// FuzzDisableChannels: only bytes of channel names change, and only to '_'.
func FuzzDisableChannels(f *testing.F) {
	f.Add(connectInitial("rdpdr", "cliprdr"))
	f.Add(connectInitialWith([]byte{0x03, 0xc0, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00}, "cliprdr"))
	f.Add(clientInfo(0x133, 0))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		orig := bytes.Clone(pkt)
		_, n, _ := DisableChannels(pkt, []string{"cliprdr", "rdpdr"})
		diff := 0
		for i := range pkt {
			if pkt[i] != orig[i] {
				diff++
				if pkt[i] != '_' {
					t.Fatalf("byte %d became %02x", i, pkt[i])
				}
			}
		}
		if diff > n {
			t.Fatalf("%d bytes changed for %d channels", diff, n)
		}
	})
}

// TestRaiseClientBuild: IronRDP's browser client sends client build 0
// in its core data; raised, the four bytes after the keyboard layout
// read 2600 (28 0a 00 00), and nothing else in the packet changes.
func TestRaiseClientBuild(t *testing.T) {
	pkt := connectInitial("cliprdr")
	orig := bytes.Clone(pkt)
	raised, err := RaiseClientBuild(pkt, 2600)
	if err != nil || !raised {
		t.Fatalf("raised %v, %v", raised, err)
	}
	at := bytes.Index(orig, []byte{0x01, 0xc0, 0xd8, 0x00}) + coreClientBuild
	if got := hex.EncodeToString(pkt[at : at+4]); got != "280a0000" {
		t.Fatalf("client build bytes %s", got)
	}
	copy(pkt[at:at+4], orig[at:at+4])
	if !bytes.Equal(pkt, orig) {
		t.Fatal("bytes other than the client build changed")
	}
	// A client that reports a newer build keeps it.
	high := connectInitial("cliprdr")
	binary.LittleEndian.PutUint32(high[at:], 19041)
	keep := bytes.Clone(high)
	if raised, err := RaiseClientBuild(high, 2600); raised || err != nil || !bytes.Equal(high, keep) {
		t.Fatalf("changed a build of 19041: %v, %v", raised, err)
	}
	// Other packets stay as they are; a broken Connect Initial is refused.
	for _, p := range [][]byte{unhex(t, specRequest), clientInfo(0x133, 40)} {
		o := bytes.Clone(p)
		if raised, err := RaiseClientBuild(p, 2600); raised || err != nil || !bytes.Equal(p, o) {
			t.Errorf("changed a packet that is no Connect Initial: %v, %v", raised, err)
		}
	}
	bad := connectInitial("cliprdr")
	bad[len(bad)-12-8+2] = 0xff
	if _, err := RaiseClientBuild(bad, 2600); err == nil {
		t.Error("accepted a Connect Initial whose blocks do not add up")
	}
}

// FuzzRaiseClientBuild: at most the four bytes of one client build
// change, and then they hold the build asked for.
func FuzzRaiseClientBuild(f *testing.F) {
	f.Add(connectInitial("rdpdr", "cliprdr"))
	f.Add(clientInfo(0x133, 0))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		orig := bytes.Clone(pkt)
		raised, err := RaiseClientBuild(pkt, 2600)
		first, last := -1, -1
		for i := range pkt {
			if pkt[i] != orig[i] {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		if first < 0 {
			return
		}
		if !raised {
			t.Fatalf("bytes %d..%d changed but raised is false (%v)", first, last, err)
		}
		if last-first > 3 {
			t.Fatalf("bytes %d..%d changed", first, last)
		}
		for at := last - 3; at <= first; at++ {
			if at >= 0 && at+4 <= len(pkt) && binary.LittleEndian.Uint32(pkt[at:]) == 2600 && binary.LittleEndian.Uint32(orig[at:]) < 2600 {
				return
			}
		}
		t.Fatalf("bytes %d..%d changed to %x, not a build of 2600", first, last, pkt[first:last+1])
	})
}

// TestSetKeyboardLayout: IronRDP's browser client sends keyboard layout
// 0; set to French, the four bytes before the client build read 0x040C
// (0c 04 00 00), and nothing else in the packet changes. A layout the
// client gave is kept.
func TestSetKeyboardLayout(t *testing.T) {
	pkt := connectInitial("cliprdr")
	orig := bytes.Clone(pkt)
	set, err := SetKeyboardLayout(pkt, 0x040C)
	if err != nil || !set {
		t.Fatalf("set %v, %v", set, err)
	}
	at := bytes.Index(orig, []byte{0x01, 0xc0, 0xd8, 0x00}) + coreKeyboard
	if got := hex.EncodeToString(pkt[at : at+4]); got != "0c040000" {
		t.Fatalf("keyboard layout bytes %s", got)
	}
	copy(pkt[at:at+4], orig[at:at+4])
	if !bytes.Equal(pkt, orig) {
		t.Fatal("bytes other than the keyboard layout changed")
	}
	given := connectInitial("cliprdr")
	binary.LittleEndian.PutUint32(given[at:], 0x0407)
	keep := bytes.Clone(given)
	if set, err := SetKeyboardLayout(given, 0x040C); set || err != nil || !bytes.Equal(given, keep) {
		t.Fatalf("changed the client's own layout: %v, %v", set, err)
	}
	for _, p := range [][]byte{unhex(t, specRequest), clientInfo(0x133, 40)} {
		o := bytes.Clone(p)
		if set, err := SetKeyboardLayout(p, 0x040C); set || err != nil || !bytes.Equal(p, o) {
			t.Errorf("changed a packet that is no Connect Initial: %v, %v", set, err)
		}
	}
	bad := connectInitial("cliprdr")
	bad[len(bad)-12-8+2] = 0xff
	if _, err := SetKeyboardLayout(bad, 0x040C); err == nil {
		t.Error("accepted a Connect Initial whose blocks do not add up")
	}
}

// FuzzSetKeyboardLayout: at most the four bytes of one keyboard layout
// change, from 0 to the layout asked for.
func FuzzSetKeyboardLayout(f *testing.F) {
	f.Add(connectInitial("rdpdr", "cliprdr"))
	f.Add(clientInfo(0x133, 0))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		orig := bytes.Clone(pkt)
		set, _ := SetKeyboardLayout(pkt, 0x040C)
		first, last := -1, -1
		for i := range pkt {
			if pkt[i] != orig[i] {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		if first < 0 {
			return
		}
		if !set || last-first > 3 {
			t.Fatalf("bytes %d..%d changed (set %v)", first, last, set)
		}
		for at := last - 3; at <= first; at++ {
			if at >= 0 && at+4 <= len(pkt) && binary.LittleEndian.Uint32(pkt[at:]) == 0x040C && binary.LittleEndian.Uint32(orig[at:]) == 0 {
				return
			}
		}
		t.Fatalf("bytes %d..%d changed to %x, not a layout of 0x040C over 0", first, last, pkt[first:last+1])
	})
}

func TestConnectionRequestPacket(t *testing.T) {
	pkt := ConnectionRequestPacket(ProtocolSSL)
	if !bytes.Equal(pkt, unhex(t, `03000013 0e e0 0000 0000 00 01 00 0800 01000000`)) {
		t.Fatalf("packet % x", pkt)
	}
	if cr, err := ParseConnectionRequest(pkt); err != nil || !cr.HasNeg || cr.Protocols != ProtocolSSL {
		t.Fatalf("parsed %+v, %v", cr, err)
	}
}
