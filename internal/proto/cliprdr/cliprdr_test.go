package cliprdr

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

// pass is what the caller of Pass sends for pdu.
func pass(g *Gate, out, pdu []byte) ([]byte, Event) {
	held, after, ev := g.Pass(pdu)
	if !held {
		out = append(out, pdu...)
	}
	for _, p := range after {
		out = append(out, p...)
	}
	return out, ev
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// xrdp 0.9.21's MCS Connect Response to a client asking for three
// channels (cliprdr, rdpsnd, drdynvc): TPKT, X.224 Data, BER
// Connect-Response, the GCC Conference Create Response, then SC_CORE
// with the requested protocols, SC_NET (I/O channel 1003, channels 1004
// to 1006, a pad) and SC_SECURITY (none).
const connectResponse = `
03 00 00 69 02 f0 80 7f 66 5f
0a 01 00 02 01 00 30 1a 02 01 22 02 01 03 02 01 00 02 01 01 02 01 00 02 01 01 02 03 00 ff f8 02 01 02
04 3b
00 05 00 14 7c 00 01 2a 14 76 0a 01 01 00 01 c0 00 4d 63 44 6e 80 24
01 0c 0c 00 04 00 08 00 01 00 00 00
03 0c 10 00 eb 03 03 00 ec 03 ed 03 ee 03 00 00
02 0c 08 00 00 00 00 00`

// sdin is a Send Data Indication on channel 0x03ec (cliprdr above) of a
// channel PDU with flags and the clipboard message msg (its header only).
func sdin(flags, msg string) string {
	return "03 00 00 1e 02 f0 80 68 00 02 03 ec 70 10 08 00 00 00 " + flags + " " + msg + " 00 00 00 00 00 00"
}

var (
	monitorReady   = sdin("03 00 00 00", "01 00")
	formatList     = sdin("03 00 00 00", "02 00")
	formatListResp = sdin("03 00 00 00", "03 00")
	dataRequest    = sdin("03 00 00 00", "04 00")
	listFirstChunk = sdin("01 00 00 00", "02 00")
	respFirstChunk = sdin("01 00 00 00", "03 00")
	laterChunk     = sdin("02 00 00 00", "03 00") // a last chunk: its bytes are not a header
	onOtherChannel = strings.Replace(formatList, "03 ec", "03 ed", 1)
	// A fast-path bitmap update: graphics pass as they come.
	graphics = "00 0a 01 06 00 01 00 00 00 00"
)

func TestChannelIDs(t *testing.T) {
	ids, ok := ChannelIDs(unhex(t, connectResponse))
	if !ok || len(ids) != 3 || ids[0] != 1004 || ids[1] != 1005 || ids[2] != 1006 {
		t.Fatalf("ChannelIDs = %v %v, want [1004 1005 1006] true", ids, ok)
	}
	for name, s := range map[string]string{
		"a Send Data Indication": monitorReady,
		"cut short":              connectResponse[:len(connectResponse)-30],
		"an overlong SC_NET":     strings.Replace(connectResponse, "eb 03 03 00", "eb 03 09 00", 1),
	} {
		p := unhex(t, s)
		if strings.HasPrefix(name, "cut") {
			p[3] = byte(len(p))
		}
		if ids, ok := ChannelIDs(p); ok {
			t.Errorf("%s: ChannelIDs = %v, true", name, ids)
		}
	}
}

// TestGate: the host's Format List, and what follows it on the channel,
// waits for the Format List Response that makes the client ready, and
// goes right after it; everything else passes at once.
func TestGate(t *testing.T) {
	cases := []struct {
		name  string
		watch bool
		in    []string
		out   [][]string // what each Pass returns, in order
		ev    []Event
	}{
		{"an offer before the client is ready", true,
			[]string{monitorReady, formatList, graphics, dataRequest, formatListResp, formatList},
			[][]string{{monitorReady}, nil, {graphics}, nil, {formatListResp, formatList, dataRequest}, {formatList}},
			[]Event{None, Held, None, None, Released, None}},
		{"the client ready first", true,
			[]string{monitorReady, formatListResp, formatList},
			[][]string{{monitorReady}, {formatListResp}, {formatList}},
			[]Event{None, None, None}},
		{"no channel watched", false,
			[]string{formatList, formatListResp},
			[][]string{{formatList}, {formatListResp}},
			[]Event{None, None}},
		{"another channel", true,
			[]string{onOtherChannel},
			[][]string{{onOtherChannel}},
			[]Event{None}},
		{"a chunked offer and a chunked answer", true,
			[]string{listFirstChunk, laterChunk, respFirstChunk, laterChunk},
			[][]string{nil, nil, nil, nil},
			[]Event{Held, None, None, None}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var g Gate
			if c.watch {
				g.Watch(0x03ec)
			}
			if g.Active() {
				t.Fatal("active before any PDU")
			}
			for i, s := range c.in {
				got, ev := pass(&g, nil, unhex(t, s))
				var want []byte
				for _, w := range c.out[i] {
					want = append(want, unhex(t, w)...)
				}
				if !bytes.Equal(got, want) || ev != c.ev[i] {
					t.Fatalf("PDU %d: Pass = % x, %v; want % x, %v", i, got, ev, want, c.ev[i])
				}
			}
			if want := c.watch && c.name != "another channel"; g.Active() != want {
				t.Fatalf("Active() = %v after the host's PDUs, want %v", g.Active(), want)
			}
		})
	}
}

// TestGateOverflow: a host that keeps offering while the client never
// becomes ready gets its offers through, as without a gate, once the
// gate holds its limit.
func TestGateOverflow(t *testing.T) {
	var g Gate
	g.Watch(0x03ec)
	p := unhex(t, formatList)
	for i := 0; i < maxHeld; i++ {
		if out, _ := pass(&g, nil, p); len(out) != 0 {
			t.Fatalf("offer %d passed", i)
		}
	}
	out, ev := pass(&g, nil, p)
	if ev != Overflowed || len(out) != (maxHeld+1)*len(p) {
		t.Fatalf("Pass beyond the limit = %d bytes, %v; want %d, Overflowed", len(out), ev, (maxHeld+1)*len(p))
	}
	if out, ev := pass(&g, nil, p); len(out) != len(p) || ev != None {
		t.Fatalf("after the overflow: %d bytes, %v", len(out), ev)
	}
}

// FuzzGate: whatever the host sends, each PDU comes out once, whole,
// in the order of its channel, once the gate has released.
func FuzzGate(f *testing.F) {
	for _, s := range []string{connectResponse, monitorReady, formatList, formatListResp, listFirstChunk, graphics} {
		f.Add(unhex(f, s), unhex(f, formatList))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		_, _ = ChannelIDs(a)
		var g Gate
		g.Watch(0x03ec)
		var out []byte
		var in int
		for _, p := range [][]byte{a, b, a, b} {
			in += len(p)
			out, _ = pass(&g, out, p)
		}
		for _, p := range g.Release() {
			out = append(out, p...)
		}
		if len(out) != in {
			t.Fatalf("%d bytes in, %d out", in, len(out))
		}
	})
}
