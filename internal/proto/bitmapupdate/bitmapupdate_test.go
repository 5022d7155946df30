package bitmapupdate

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rect is a TS_BITMAP_DATA with a 3-byte bitmap.
func rect(l, t, r, b, w, h int) []byte {
	out := make([]byte, 18, 21)
	for i, v := range []int{l, t, r, b, w, h, 16, 0x401, 3} {
		binary.LittleEndian.PutUint16(out[2*i:], uint16(v))
	}
	return append(out, 0xaa, 0xbb, 0xcc)
}

func bitmapData(rects ...[]byte) []byte {
	b := binary.LittleEndian.AppendUint16(nil, 1)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(rects)))
	for _, r := range rects {
		b = append(b, r...)
	}
	return b
}

// slowPath wraps TS_UPDATE_BITMAP_DATA as xrdp sends it: TPKT, X.224
// Data, MCS Send Data Indication, Share Control and Share Data headers.
func slowPath(update []byte) []byte {
	sd := append([]byte{0xea, 0x03, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00}, update...)
	binary.LittleEndian.PutUint16(sd[6:], uint16(len(update)+4))
	sc := binary.LittleEndian.AppendUint16(nil, uint16(6+len(sd)))
	sc = append(sc, 0x17, 0x00, 0xea, 0x03)
	sc = append(sc, sd...)
	mcs := []byte{0x68, 0x00, 0x01, 0x03, 0xeb, 0x70, 0x80 | byte(len(sc)>>8), byte(len(sc))}
	body := append(append([]byte{0x02, 0xf0, 0x80}, mcs...), sc...)
	return append([]byte{3, 0, byte((len(body) + 4) >> 8), byte(len(body) + 4)}, body...)
}

// fastPath wraps it as a fast-path bitmap update.
func fastPath(update []byte) []byte {
	u := append([]byte{0x01}, binary.LittleEndian.AppendUint16(nil, uint16(len(update)))...)
	u = append(u, update...)
	n := len(u) + 3
	return append([]byte{0x00, 0x80 | byte(n>>8), byte(n)}, u...)
}

// TestWidenSlowPath: the rectangles xrdp sent while an xterm moved: a
// 496-pixel bitmap for a 494-pixel destination becomes a 496-pixel one.
func TestWidenSlowPath(t *testing.T) {
	pdu := slowPath(bitmapData(rect(40, 420, 533, 435, 496, 16), rect(51, 82, 116, 94, 68, 13), rect(0, 604, 1279, 609, 1280, 6)))
	n, err := Len(pdu)
	if err != nil || n != len(pdu) {
		t.Fatalf("Len = %d, %v; want %d", n, err, len(pdu))
	}
	want := slowPath(bitmapData(rect(40, 420, 535, 435, 496, 16), rect(51, 82, 118, 94, 68, 13), rect(0, 604, 1279, 609, 1280, 6)))
	changed, err := Widen(pdu)
	if err != nil || changed != 2 {
		t.Fatalf("Widen = %d, %v; want 2 rectangles", changed, err)
	}
	if !bytes.Equal(pdu, want) {
		t.Fatalf("got\n%x\nwant\n%x", pdu, want)
	}
	if changed, _ := Widen(pdu); changed != 0 {
		t.Fatalf("a second pass changed %d rectangles", changed)
	}
}

// A hand-checked vector of the same update: destRight 0x0215 (533)
// becomes 0x0217 (535).
func TestWidenVector(t *testing.T) {
	pdu := unhex(t, `0300003a 02f080 68 0001 03eb 70 802b 2b00 1700 ea03 ea030100 00 01 1d00 02 00 0000
		0100 0100 2800 a401 1502 b301 f001 1000 1000 0104 0300 aabbcc`)
	want := unhex(t, `0300003a 02f080 68 0001 03eb 70 802b 2b00 1700 ea03 ea030100 00 01 1d00 02 00 0000
		0100 0100 2800 a401 1702 b301 f001 1000 1000 0104 0300 aabbcc`)
	if changed, err := Widen(pdu); changed != 1 || err != nil || !bytes.Equal(pdu, want) {
		t.Fatalf("Widen = %d, %v:\n%x", changed, err, pdu)
	}
}

func TestWidenFastPath(t *testing.T) {
	pdu := fastPath(bitmapData(rect(48, 404, 549, 419, 504, 16)))
	n, err := Len(pdu)
	if err != nil || n != len(pdu) {
		t.Fatalf("Len = %d, %v; want %d", n, err, len(pdu))
	}
	if changed, err := Widen(pdu); changed != 1 || err != nil {
		t.Fatalf("Widen = %d, %v", changed, err)
	}
	if !bytes.Equal(pdu, fastPath(bitmapData(rect(48, 404, 551, 419, 504, 16)))) {
		t.Fatalf("got %x", pdu)
	}
}

func TestWidenLeavesOthers(t *testing.T) {
	for name, pdu := range map[string][]byte{
		// A slow-path update of another type (orders) and a compressed one.
		"orders":     slowPath(append([]byte{0x00, 0x00}, bitmapData(rect(1, 1, 2, 2, 4, 2))[2:]...)),
		"compressed": func() []byte { p := slowPath(bitmapData(rect(1, 1, 2, 2, 4, 2))); p[4+3+8+6+9] = 0x20; return p }(),
		// A fast-path pointer update (code 11).
		"pointer": {0x00, 0x08, 0x0b, 0x03, 0x00, 0x01, 0x02, 0x03},
		// A server's X.224 Connection Confirm.
		"confirm": unhex(t, `03000013 0e d0 0000 1234 00 02 00 0800 01000000`),
	} {
		orig := bytes.Clone(pdu)
		if changed, err := Widen(pdu); changed != 0 || err != nil || !bytes.Equal(pdu, orig) {
			t.Errorf("%s: Widen = %d, %v; changed bytes %v", name, changed, err, !bytes.Equal(pdu, orig))
		}
	}
}

func TestLen(t *testing.T) {
	for _, c := range []struct {
		in   []byte
		n    int
		fail bool
	}{
		{[]byte{3}, 0, false},
		{[]byte{3, 0, 0}, 0, false},
		{[]byte{3, 0, 1, 0}, 256, false},
		{[]byte{0x00, 0x81}, 0, false},
		{[]byte{0x00, 0x81, 0x02}, 258, false},
		{[]byte{0x00, 0x10}, 16, false},
		{[]byte{0x16, 0x03}, 0, true},
		{[]byte{3, 0, 0, 2}, 0, true},
	} {
		n, err := Len(c.in)
		if n != c.n || (err != nil) != c.fail {
			t.Errorf("Len(%x) = %d, %v", c.in, n, err)
		}
	}
}

// FuzzWiden: whatever the host sends, Widen keeps the length, touches
// only destination fields (so a second pass changes nothing), and never
// panics.
func FuzzWiden(f *testing.F) {
	f.Add(slowPath(bitmapData(rect(40, 420, 533, 435, 496, 16))))
	f.Add(fastPath(bitmapData(rect(48, 404, 549, 419, 504, 16), rect(0, 0, 0, 0, 0, 0))))
	f.Add([]byte{0x00, 0x08, 0x0b, 0x03, 0x00, 0x01, 0x02, 0x03})
	f.Fuzz(func(t *testing.T, pdu []byte) {
		n, err := Len(pdu)
		if err != nil || n != len(pdu) {
			return
		}
		size := len(pdu)
		if _, err := Widen(pdu); err != nil {
			return
		}
		if len(pdu) != size {
			t.Fatal("Widen changed the length")
		}
		if changed, err := Widen(pdu); changed != 0 || err != nil {
			t.Fatalf("a second pass changed %d rectangles (%v)", changed, err)
		}
	})
}
