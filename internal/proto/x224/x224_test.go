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

// corePatch is a function that rewrites one four-byte field of a
// Connect Initial's core data, as its tests see it.
type corePatch struct {
	field string // its name, for the failures
	apply func(pkt []byte) (bool, error)
	at    int    // the field's offset in the core data
	want  string // the field's bytes once apply has rewritten 0, in hex
	// given is a value a client may send that apply keeps.
	given uint32
	// rewrote tells whether the field going from old to new is apply's
	// own rewrite.
	rewrote func(old, new uint32) bool
}

// check: apply rewrites the field of a Connect Initial that holds 0 to
// want and changes nothing else; it keeps a given value, leaves other
// packets as they are, and refuses a Connect Initial whose blocks do
// not add up.
func (c corePatch) check(t *testing.T) {
	pkt := connectInitial("cliprdr")
	orig := bytes.Clone(pkt)
	done, err := c.apply(pkt)
	if err != nil || !done {
		t.Fatalf("%s: rewrote %v, %v", c.field, done, err)
	}
	at := bytes.Index(orig, []byte{0x01, 0xc0, 0xd8, 0x00}) + c.at
	if got := hex.EncodeToString(pkt[at : at+4]); got != c.want {
		t.Fatalf("%s bytes %s", c.field, got)
	}
	copy(pkt[at:at+4], orig[at:at+4])
	if !bytes.Equal(pkt, orig) {
		t.Fatalf("bytes other than the %s changed", c.field)
	}
	given := connectInitial("cliprdr")
	binary.LittleEndian.PutUint32(given[at:], c.given)
	keep := bytes.Clone(given)
	if done, err := c.apply(given); done || err != nil || !bytes.Equal(given, keep) {
		t.Fatalf("changed a %s of %#x: %v, %v", c.field, c.given, done, err)
	}
	for _, p := range [][]byte{unhex(t, specRequest), clientInfo(0x133, 40)} {
		o := bytes.Clone(p)
		if done, err := c.apply(p); done || err != nil || !bytes.Equal(p, o) {
			t.Errorf("changed a packet that is no Connect Initial: %v, %v", done, err)
		}
	}
	bad := connectInitial("cliprdr")
	bad[len(bad)-12-8+2] = 0xff
	if _, err := c.apply(bad); err == nil {
		t.Error("accepted a Connect Initial whose blocks do not add up")
	}
}

// fuzz: at most the four bytes of one field change, and then by apply's
// own rewrite.
func (c corePatch) fuzz(f *testing.F) {
	f.Add(connectInitial("rdpdr", "cliprdr"))
	f.Add(clientInfo(0x133, 0))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		orig := bytes.Clone(pkt)
		done, err := c.apply(pkt)
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
		if !done || last-first > 3 {
			t.Fatalf("bytes %d..%d changed (rewrote %v, %v)", first, last, done, err)
		}
		for at := last - 3; at <= first; at++ {
			if at >= 0 && at+4 <= len(pkt) && c.rewrote(binary.LittleEndian.Uint32(orig[at:]), binary.LittleEndian.Uint32(pkt[at:])) {
				return
			}
		}
		t.Fatalf("bytes %d..%d changed to %x, not a rewrite of the %s", first, last, pkt[first:last+1], c.field)
	})
}

// raiseBuild: IronRDP's browser client sends client build 0 in its core
// data; raised, the four bytes after the keyboard layout read 2600
// (28 0a 00 00). A client that reports a newer build keeps it.
var raiseBuild = corePatch{
	field: "client build",
	apply: func(pkt []byte) (bool, error) { return RaiseClientBuild(pkt, 2600) },
	at:    coreClientBuild, want: "280a0000", given: 19041,
	rewrote: func(old, new uint32) bool { return new == 2600 && old < 2600 },
}

// setLayout: IronRDP's browser client sends keyboard layout 0; set to
// French, the four bytes before the client build read 0x040C
// (0c 04 00 00). A layout the client gave is kept.
var setLayout = corePatch{
	field: "keyboard layout",
	apply: func(pkt []byte) (bool, error) { return SetKeyboardLayout(pkt, 0x040C) },
	at:    coreKeyboard, want: "0c040000", given: 0x0407,
	rewrote: func(old, new uint32) bool { return new == 0x040C && old == 0 },
}

func TestRaiseClientBuild(t *testing.T)  { raiseBuild.check(t) }
func FuzzRaiseClientBuild(f *testing.F)  { raiseBuild.fuzz(f) }
func TestSetKeyboardLayout(t *testing.T) { setLayout.check(t) }
func FuzzSetKeyboardLayout(f *testing.F) { setLayout.fuzz(f) }

func TestConnectionRequestPacket(t *testing.T) {
	pkt := ConnectionRequestPacket(ProtocolSSL)
	if !bytes.Equal(pkt, unhex(t, `03000013 0e e0 0000 0000 00 01 00 0800 01000000`)) {
		t.Fatalf("packet % x", pkt)
	}
	if cr, err := ParseConnectionRequest(pkt); err != nil || !cr.HasNeg || cr.Protocols != ProtocolSSL {
		t.Fatalf("parsed %+v, %v", cr, err)
	}
}
