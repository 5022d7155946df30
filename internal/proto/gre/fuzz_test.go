package gre

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// FuzzDecode: any input is accepted or refused without panicking, and
// what is accepted encodes back to the same bytes (decode, encode,
// decode, equal).
func FuzzDecode(f *testing.F) {
	for _, v := range scapyVectors {
		b, _ := hex.DecodeString(v.hex)
		f.Add(b)
	}
	f.Add([]byte{0x80, 0, 0x08, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if p.Decode(b) != nil {
			return
		}
		got, err := p.Append(nil)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		want := b
		if p.Checksum && got[4]|got[5] == 0 && b[4]&b[5] == 0xff {
			// Ones' complement has two zeros: a sender may write
			// ffff where Put writes 0000, and both verify.
			want = bytes.Clone(b)
			want[4], want[5] = 0, 0
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("round trip: %x; want %x", got, b)
		}
		var q Packet
		if err := q.Decode(got); err != nil || q.Header != p.Header || !bytes.Equal(q.Payload, p.Payload) {
			t.Fatalf("second decode: %+v, %v", q.Header, err)
		}
	})
}
