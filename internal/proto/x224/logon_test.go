package x224

import (
	"bytes"
	"encoding/binary"
	"testing"
	"unicode/utf16"

	"github.com/deskway/deskway/internal/proto/x224/x224test"
)

// clientInfoWith is a Unicode Client Info PDU with the given strings
// (domain, user, password, shell, working directory) and extra bytes of
// extended info.
func clientInfoWith(strs [5]string, extra []byte) []byte {
	info := binary.LittleEndian.AppendUint32(nil, 0x0409)
	info = binary.LittleEndian.AppendUint32(info, 0x133)
	var enc [5][]byte
	for i, s := range strs {
		for _, u := range utf16.Encode([]rune(s)) {
			enc[i] = binary.LittleEndian.AppendUint16(enc[i], u)
		}
		info = binary.LittleEndian.AppendUint16(info, uint16(len(enc[i])))
	}
	for _, e := range enc {
		info = append(append(info, e...), 0, 0)
	}
	info = append(info, extra...)
	user := append([]byte{0x40, 0x00, 0x00, 0x00}, info...)
	mcs := append([]byte{0x64, 0x00, 0x06, 0x03, 0xeb, 0x70}, x224test.PERLength(len(user))...)
	body := append(append([]byte{0x02, 0xf0, 0x80}, mcs...), user...)
	return append([]byte{3, 0, byte((len(body) + 4) >> 8), byte(len(body) + 4)}, body...)
}

func TestSetCredentials(t *testing.T) {
	extra := bytes.Repeat([]byte{0xa5}, 90)
	for _, typed := range [][5]string{
		{"", "", "", "", ""},
		{"CORP", "someone-else", "a guess", "/bin/sh", "/tmp"},
		{"", "ü", "", "", ""},
	} {
		pkt := clientInfoWith(typed, extra)
		got, ok, err := SetCredentials(pkt, Credentials{User: "deskway-demo", Password: "s3cret-é"})
		if err != nil || !ok {
			t.Fatalf("%q: %v, %v", typed, ok, err)
		}
		want := clientInfoWith([5]string{"", "deskway-demo", "s3cret-é", typed[3], typed[4]}, extra)
		// The flags gain auto-logon.
		i := bytes.Index(want, []byte{0x09, 0x04, 0, 0, 0x33, 0x01, 0, 0})
		binary.LittleEndian.PutUint32(want[i+4:], 0x133|InfoAutoLogon)
		if !bytes.Equal(got, want) {
			t.Fatalf("%q: got\n%x\nwant\n%x", typed, got, want)
		}
		if n, err := TPKTLen(got); err != nil || n != len(got) {
			t.Fatalf("TPKT length %d of %d: %v", n, len(got), err)
		}
	}
	// Other packets pass untouched.
	req := unhex(t, specRequest)
	if got, ok, err := SetCredentials(req, Credentials{User: "x"}); ok || err != nil || !bytes.Equal(got, req) {
		t.Fatalf("connection request: %v %v", ok, err)
	}
	// A Client Info PDU that is not Unicode is refused, not passed on.
	if _, ok, err := SetCredentials(clientInfo(0x103, 40), Credentials{User: "x"}); !ok || err == nil {
		t.Fatalf("ANSI client info: %v %v", ok, err)
	}
}

// FuzzSetCredentials: no packet makes it panic, and what it rewrites is
// a whole TPKT packet.
func FuzzSetCredentials(f *testing.F) {
	f.Add(clientInfoWith([5]string{"", "u", "p", "", ""}, nil))
	f.Add(clientInfo(0x133, 30))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		got, ok, err := SetCredentials(pkt, Credentials{User: "acct", Password: "pw"})
		if ok && err == nil {
			if n, err := TPKTLen(got); err != nil || n != len(got) {
				t.Fatalf("rewrote into a packet of %d bytes whose TPKT says %d (%v)", len(got), n, err)
			}
		}
	})
}
