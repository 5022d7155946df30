// Package ntlm encodes and decodes the three NTLM messages (MS-NLMP 2.2.1)
// that clients carry in HTTP Authorization headers. It is pure: no I/O and
// no cryptography; verifying a response lives in package auth.
package ntlm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unicode/utf16"
)

// Signature starts every NTLM message.
var Signature = []byte("NTLMSSP\x00")

// Message types.
const (
	TypeNegotiate    uint32 = 1
	TypeChallenge    uint32 = 2
	TypeAuthenticate uint32 = 3
)

// Negotiate flags (MS-NLMP 2.2.2.5) this project reads or sets.
const (
	FlagUnicode                 uint32 = 0x00000001
	FlagOEM                     uint32 = 0x00000002
	FlagRequestTarget           uint32 = 0x00000004
	FlagSign                    uint32 = 0x00000010
	FlagSeal                    uint32 = 0x00000020
	FlagNTLM                    uint32 = 0x00000200
	FlagAlwaysSign              uint32 = 0x00008000
	FlagTargetTypeDomain        uint32 = 0x00010000
	FlagTargetTypeServer        uint32 = 0x00020000
	FlagExtendedSessionSecurity uint32 = 0x00080000
	FlagTargetInfo              uint32 = 0x00800000
	FlagVersion                 uint32 = 0x02000000
	Flag128                     uint32 = 0x20000000
	FlagKeyExch                 uint32 = 0x40000000
	Flag56                      uint32 = 0x80000000
)

// AV pair ids used in target info (MS-NLMP 2.2.2.1).
const (
	AvEOL             uint16 = 0
	AvNbComputerName  uint16 = 1
	AvNbDomainName    uint16 = 2
	AvDNSComputerName uint16 = 3
	AvDNSDomainName   uint16 = 4
	AvFlags           uint16 = 6
	AvTimestamp       uint16 = 7
)

// AvFlagMICPresent in MsvAvFlags says the AUTHENTICATE message carries a MIC.
const AvFlagMICPresent uint32 = 0x2

// MaxMessageLen bounds a message; real ones are a few hundred bytes.
const MaxMessageLen = 8192

// Error says what is wrong with a message.
type Error struct {
	Offset int
	Reason string
}

// Error gives the offset in the message and what was wrong there.
func (e *Error) Error() string { return fmt.Sprintf("ntlm: at offset %d: %s", e.Offset, e.Reason) }

// MessageType returns the type of an NTLM message after checking its signature.
func MessageType(b []byte) (uint32, error) {
	if len(b) > MaxMessageLen {
		return 0, &Error{0, fmt.Sprintf("message of %d bytes over %d", len(b), MaxMessageLen)}
	}
	if len(b) < 12 || !bytes.Equal(b[:8], Signature) {
		return 0, &Error{0, "no NTLMSSP signature"}
	}
	return binary.LittleEndian.Uint32(b[8:]), nil
}

// field reads a (len, maxlen, offset) security buffer descriptor at off and
// returns the bytes it points to.
func field(b []byte, off int, what string) ([]byte, error) {
	if len(b) < off+8 {
		return nil, &Error{off, what + " descriptor truncated"}
	}
	l := int(binary.LittleEndian.Uint16(b[off:]))
	o := int(binary.LittleEndian.Uint32(b[off+4:]))
	if l == 0 {
		return nil, nil
	}
	if o < 0 || o > len(b) || l > len(b)-o {
		return nil, &Error{off, fmt.Sprintf("%s points to %d+%d past message end %d", what, o, l, len(b))}
	}
	return b[o : o+l : o+l], nil
}

// Negotiate is NEGOTIATE_MESSAGE.
type Negotiate struct {
	Flags uint32
}

// DecodeNegotiate parses a NEGOTIATE_MESSAGE.
func DecodeNegotiate(b []byte) (*Negotiate, error) {
	t, err := MessageType(b)
	if err != nil {
		return nil, err
	}
	if t != TypeNegotiate {
		return nil, &Error{8, fmt.Sprintf("message type %d, want NEGOTIATE", t)}
	}
	if len(b) < 16 {
		return nil, &Error{12, "negotiate flags truncated"}
	}
	return &Negotiate{Flags: binary.LittleEndian.Uint32(b[12:])}, nil
}

// Append writes a minimal NEGOTIATE_MESSAGE (no domain or workstation).
func (m *Negotiate) Append(dst []byte) []byte {
	dst = append(dst, Signature...)
	dst = binary.LittleEndian.AppendUint32(dst, TypeNegotiate)
	dst = binary.LittleEndian.AppendUint32(dst, m.Flags)
	dst = append(dst, make([]byte, 16)...) // empty domain and workstation descriptors
	return dst
}

// Challenge is CHALLENGE_MESSAGE.
type Challenge struct {
	Flags           uint32
	TargetName      string
	ServerChallenge [8]byte
	TargetInfo      []byte
}

// Append writes the CHALLENGE_MESSAGE with a Version field (6.1, as Windows
// servers send) so clients that compute a MIC see the layout they expect.
func (m *Challenge) Append(dst []byte) []byte {
	const fixed = 56
	name := EncodeUTF16(m.TargetName)
	start := len(dst)
	dst = append(dst, Signature...)
	dst = binary.LittleEndian.AppendUint32(dst, TypeChallenge)
	dst = appendField(dst, len(name), fixed)
	dst = binary.LittleEndian.AppendUint32(dst, m.Flags)
	dst = append(dst, m.ServerChallenge[:]...)
	dst = append(dst, make([]byte, 8)...)
	dst = appendField(dst, len(m.TargetInfo), fixed+len(name))
	dst = append(dst, 6, 1, 0xb1, 0x1d, 0, 0, 0, 15) // version 6.1 build 7601, NTLM revision 15
	if len(dst)-start != fixed {
		panic("ntlm: challenge layout")
	}
	dst = append(dst, name...)
	return append(dst, m.TargetInfo...)
}

// DecodeChallenge parses a CHALLENGE_MESSAGE.
func DecodeChallenge(b []byte) (*Challenge, error) {
	t, err := MessageType(b)
	if err != nil {
		return nil, err
	}
	if t != TypeChallenge {
		return nil, &Error{8, fmt.Sprintf("message type %d, want CHALLENGE", t)}
	}
	if len(b) < 48 {
		return nil, &Error{12, "challenge truncated"}
	}
	m := &Challenge{Flags: binary.LittleEndian.Uint32(b[20:])}
	copy(m.ServerChallenge[:], b[24:32])
	name, err := field(b, 12, "TargetName")
	if err != nil {
		return nil, err
	}
	m.TargetName = DecodeUTF16(name)
	if m.TargetInfo, err = field(b, 40, "TargetInfo"); err != nil {
		return nil, err
	}
	return m, nil
}

func appendField(dst []byte, n, off int) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(n))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(n))
	return binary.LittleEndian.AppendUint32(dst, uint32(off))
}

// Authenticate is AUTHENTICATE_MESSAGE. Byte fields alias the decoded buffer.
type Authenticate struct {
	LmResponse   []byte
	NtResponse   []byte
	Domain       string
	User         string
	Workstation  string
	EncryptedKey []byte
	Flags        uint32
	// MICOffset is where the 16-byte MIC sits (0 when the message is too
	// short to hold one); Raw is the whole message, for MIC checks.
	MICOffset int
	Raw       []byte
}

// DecodeAuthenticate parses an AUTHENTICATE_MESSAGE.
func DecodeAuthenticate(b []byte) (*Authenticate, error) {
	t, err := MessageType(b)
	if err != nil {
		return nil, err
	}
	if t != TypeAuthenticate {
		return nil, &Error{8, fmt.Sprintf("message type %d, want AUTHENTICATE", t)}
	}
	if len(b) < 64 {
		return nil, &Error{12, "authenticate truncated"}
	}
	m := &Authenticate{Raw: b, Flags: binary.LittleEndian.Uint32(b[60:])}
	if m.LmResponse, err = field(b, 12, "LmChallengeResponse"); err != nil {
		return nil, err
	}
	if m.NtResponse, err = field(b, 20, "NtChallengeResponse"); err != nil {
		return nil, err
	}
	var dom, user, ws []byte
	if dom, err = field(b, 28, "DomainName"); err != nil {
		return nil, err
	}
	if user, err = field(b, 36, "UserName"); err != nil {
		return nil, err
	}
	if ws, err = field(b, 44, "Workstation"); err != nil {
		return nil, err
	}
	if m.EncryptedKey, err = field(b, 52, "EncryptedRandomSessionKey"); err != nil {
		return nil, err
	}
	if m.Flags&FlagUnicode == 0 {
		return nil, &Error{60, "OEM (non-Unicode) strings are not supported"}
	}
	m.Domain, m.User, m.Workstation = DecodeUTF16(dom), DecodeUTF16(user), DecodeUTF16(ws)
	// The MIC follows the 8-byte Version when the payload starts after it.
	if minPayloadOffset(b) >= 88 {
		m.MICOffset = 72
	}
	return m, nil
}

// minPayloadOffset is the lowest offset any non-empty field points to; the
// fixed part of the message (Version, MIC) ends there.
func minPayloadOffset(b []byte) int {
	min := len(b)
	for off := 12; off <= 52; off += 8 {
		if binary.LittleEndian.Uint16(b[off:]) == 0 {
			continue
		}
		if o := int(binary.LittleEndian.Uint32(b[off+4:])); o < min {
			min = o
		}
	}
	return min
}

// AuthenticateFields are the inputs to EncodeAuthenticate.
type AuthenticateFields struct {
	LmResponse, NtResponse    []byte
	Domain, User, Workstation string
	EncryptedKey              []byte
	Flags                     uint32
}

// EncodeAuthenticate writes an AUTHENTICATE_MESSAGE with Version and a zero
// MIC at offset 72, which the caller may fill in afterwards.
func EncodeAuthenticate(f AuthenticateFields) []byte {
	const fixed = 88
	dom, user, ws := EncodeUTF16(f.Domain), EncodeUTF16(f.User), EncodeUTF16(f.Workstation)
	b := append([]byte{}, Signature...)
	b = binary.LittleEndian.AppendUint32(b, TypeAuthenticate)
	off := fixed
	for _, p := range [][]byte{f.LmResponse, f.NtResponse, dom, user, ws, f.EncryptedKey} {
		b = appendField(b, len(p), off)
		off += len(p)
	}
	b = binary.LittleEndian.AppendUint32(b, f.Flags)
	b = append(b, 6, 1, 0xb1, 0x1d, 0, 0, 0, 15)
	b = append(b, make([]byte, 16)...)
	for _, p := range [][]byte{f.LmResponse, f.NtResponse, dom, user, ws, f.EncryptedKey} {
		b = append(b, p...)
	}
	return b
}

// AvPair is one entry of a target info list.
type AvPair struct {
	ID    uint16
	Value []byte
}

// ParseAvPairs reads an AV_PAIR list up to MsvAvEOL.
func ParseAvPairs(b []byte) ([]AvPair, error) {
	var out []AvPair
	for off := 0; ; {
		if len(b)-off < 4 {
			return nil, &Error{off, "AV pair list ends without MsvAvEOL"}
		}
		id := binary.LittleEndian.Uint16(b[off:])
		n := int(binary.LittleEndian.Uint16(b[off+2:]))
		off += 4
		if id == AvEOL {
			return out, nil
		}
		if len(b)-off < n {
			return nil, &Error{off, fmt.Sprintf("AV pair %d value of %d bytes past end", id, n)}
		}
		out = append(out, AvPair{ID: id, Value: b[off : off+n : off+n]})
		off += n
	}
}

// AppendAvPairs writes pairs followed by MsvAvEOL.
func AppendAvPairs(dst []byte, pairs []AvPair) []byte {
	for _, p := range pairs {
		dst = binary.LittleEndian.AppendUint16(dst, p.ID)
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(p.Value)))
		dst = append(dst, p.Value...)
	}
	return append(dst, 0, 0, 0, 0)
}

// EncodeUTF16 returns s as UTF-16LE without a terminator.
func EncodeUTF16(s string) []byte {
	u := utf16.Encode([]rune(s))
	b := make([]byte, 2*len(u))
	for i, c := range u {
		binary.LittleEndian.PutUint16(b[2*i:], c)
	}
	return b
}

// DecodeUTF16 decodes UTF-16LE; an odd trailing byte is dropped.
func DecodeUTF16(b []byte) string {
	u := make([]uint16, len(b)/2)
	for i := range u {
		u[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return string(utf16.Decode(u))
}
