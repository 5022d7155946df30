package x224

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf16"
)

// InfoUnicode is TS_INFO_PACKET's flag for UTF-16LE strings.
const InfoUnicode = 0x0010

// Credentials are what a Client Info PDU logs on with.
type Credentials struct {
	Domain, User, Password string
}

// SetCredentials looks at one whole TPKT packet from the client. If it is
// the Client Info PDU, it returns a copy whose domain, user name and
// password are c's, with auto-logon on, and true; the rest of the PDU
// (shell, working directory, extended info) is kept. Any other packet is
// returned as it is, with false. A Client Info PDU it cannot rewrite
// (not Unicode, or cut short) is an error: the caller must not pass the
// client's own credentials on in its place.
func SetCredentials(pkt []byte, c Credentials) ([]byte, bool, error) {
	if n, err := TPKTLen(pkt); err != nil || n == 0 || n != len(pkt) {
		return pkt, false, err
	}
	b := pkt[TPKTHeaderLen:]
	if len(b) < 3 || b[0] != 2 || b[1] != 0xf0 {
		return pkt, false, nil
	}
	mcs := b[3:]
	if len(mcs) < 6 || mcs[0]>>2 != 25 {
		return pkt, false, nil
	}
	b = mcs[6:]
	if len(b) < 1 {
		return pkt, false, nil
	}
	l := int(b[0])
	if l&0x80 != 0 {
		if len(b) < 2 {
			return pkt, false, nil
		}
		l = (l&0x3f)<<8 | int(b[1])
		b = b[2:]
	} else {
		b = b[1:]
	}
	if l != len(b) {
		return pkt, false, fmt.Errorf("x224: MCS user data of %d bytes in a packet with %d", l, len(b))
	}
	if len(b) < 4+8 || binary.LittleEndian.Uint16(b)&secInfoPkt == 0 {
		return pkt, false, nil
	}
	sec, info := b[:4], b[4:]
	// CodePage, flags, then the five string lengths (without their
	// terminators).
	if len(info) < 18 {
		return pkt, true, errors.New("x224: Client Info PDU cut short")
	}
	flags := binary.LittleEndian.Uint32(info[4:])
	if flags&InfoUnicode == 0 {
		return pkt, true, errors.New("x224: Client Info PDU not in Unicode")
	}
	var cb [5]int
	for i := range cb {
		cb[i] = int(binary.LittleEndian.Uint16(info[8+2*i:]))
	}
	strs := info[18:]
	off := 0
	for _, n := range cb {
		off += n + 2
	}
	if off > len(strs) {
		return pkt, true, errors.New("x224: Client Info PDU strings cut short")
	}
	shellAndDir := strs[cb[0]+cb[1]+cb[2]+6 : off]
	rest := strs[off:]

	var out []byte
	out = binary.LittleEndian.AppendUint32(out, binary.LittleEndian.Uint32(info))
	out = binary.LittleEndian.AppendUint32(out, flags|InfoAutoLogon)
	enc := func(s string) []byte {
		var e []byte
		for _, u := range utf16.Encode([]rune(s)) {
			e = binary.LittleEndian.AppendUint16(e, u)
		}
		return e
	}
	d, u, p := enc(c.Domain), enc(c.User), enc(c.Password)
	// MS-RDPBCGR caps the domain at 52 bytes, the user name at 512 and the
	// password at 512, without their terminators.
	if len(d) > 52 || len(u) > 512 || len(p) > 512 {
		return pkt, true, errors.New("x224: credentials too long for a Client Info PDU")
	}
	for _, n := range []int{len(d), len(u), len(p), cb[3], cb[4]} {
		out = binary.LittleEndian.AppendUint16(out, uint16(n))
	}
	for _, s := range [][]byte{d, u, p} {
		out = append(out, s...)
		out = append(out, 0, 0)
	}
	out = append(out, shellAndDir...)
	out = append(out, rest...)

	user := append(append([]byte{}, sec...), out...)
	if len(user) >= 0x4000 {
		return pkt, true, errors.New("x224: Client Info PDU too long")
	}
	body := append([]byte{}, pkt[TPKTHeaderLen:TPKTHeaderLen+3]...)
	body = append(body, mcs[:6]...)
	if len(user) < 0x80 {
		body = append(body, byte(len(user)))
	} else {
		body = append(body, 0x80|byte(len(user)>>8), byte(len(user)))
	}
	body = append(body, user...)
	n := TPKTHeaderLen + len(body)
	res := []byte{3, 0, byte(n >> 8), byte(n)}
	return append(res, body...), true, nil
}
