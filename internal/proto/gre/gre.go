// Package gre is the wire format of Generic Routing Encapsulation: the
// header of RFC 2784 with the key and sequence number of RFC 2890. It is
// pure: no I/O, standard library only.
//
// Only what the site gateway carries is accepted: version 0, every
// reserved bit zero (RFC 2784 lets a receiver ignore bits 6-12; a gateway
// that names tenants by key does not guess what a sender meant by them),
// and IPv4 or IPv6 inside. The checksum, when present, is verified.
package gre

import (
	"encoding/binary"
	"fmt"
)

// Protocol types (EtherType) of the payloads the gateway carries.
const (
	ProtoIPv4 uint16 = 0x0800
	ProtoIPv6 uint16 = 0x86DD
)

// Header flag bits of the first 16 bits.
const (
	flagChecksum = 0x8000
	flagKey      = 0x2000
	flagSeq      = 0x1000
	// reservedMask is every other bit but the version's 3: RFC 1701's
	// routing, strict source route and recursion control among them.
	reservedMask = 0x4ff8
	versionMask  = 0x0007
)

// MinLen is the shortest header (no options); MaxLen the longest
// (checksum, key and sequence number).
const (
	MinLen = 4
	MaxLen = 16
)

// MaxPacket bounds a whole GRE packet: it rides in one IP datagram.
const MaxPacket = 65535

// Kind is the class of a decoding failure, for counting drops by cause.
type Kind int

// The kinds of decoding failure.
const (
	Short       Kind = iota + 1 // fewer bytes than the header says
	BadVersion                  // a version other than 0
	Reserved                    // a reserved bit set
	BadProtocol                 // a payload other than IPv4 or IPv6
	BadChecksum                 // the checksum does not verify
	TooLong                     // more than MaxPacket bytes
)

var kindNames = map[Kind]string{Short: "short", BadVersion: "version", Reserved: "reserved", BadProtocol: "protocol", BadChecksum: "checksum", TooLong: "too_long"}

// String is the kind's name as metrics label it.
func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind%d", int(k))
}

// DecodeError says where and why a packet was refused.
type DecodeError struct {
	Kind   Kind
	Offset int
	Reason string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("gre: at byte %d: %s", e.Offset, e.Reason)
}

func fail(k Kind, off int, format string, a ...any) error {
	return &DecodeError{Kind: k, Offset: off, Reason: fmt.Sprintf(format, a...)}
}

// Header is a GRE header's meaning.
type Header struct {
	// Protocol is the payload's EtherType: ProtoIPv4 or ProtoIPv6.
	Protocol uint16
	// Checksum asks for (on encoding) or reports (on decoding) the
	// checksum field; its value is computed, never set by hand.
	Checksum bool
	HasKey   bool
	Key      uint32
	HasSeq   bool
	Seq      uint32
}

// Len is the encoded header's length in bytes.
func (h *Header) Len() int {
	n := MinLen
	if h.Checksum {
		n += 4
	}
	if h.HasKey {
		n += 4
	}
	if h.HasSeq {
		n += 4
	}
	return n
}

// Put writes the header into b[:h.Len()], the payload following it in
// b[h.Len():]; with Checksum set the checksum covers both, so the payload
// must be in place first. It lets a datapath encapsulate in the headroom
// before a packet without copying it.
func (h *Header) Put(b []byte) error {
	if h.Protocol != ProtoIPv4 && h.Protocol != ProtoIPv6 {
		return fmt.Errorf("gre: protocol type %#04x is not IPv4 or IPv6", h.Protocol)
	}
	n := h.Len()
	if len(b) < n || len(b) > MaxPacket {
		return fmt.Errorf("gre: %d bytes do not hold a header of %d and at most %d in all", len(b), n, MaxPacket)
	}
	var flags uint16
	if h.Checksum {
		flags |= flagChecksum
	}
	if h.HasKey {
		flags |= flagKey
	}
	if h.HasSeq {
		flags |= flagSeq
	}
	binary.BigEndian.PutUint16(b[0:], flags)
	binary.BigEndian.PutUint16(b[2:], h.Protocol)
	i := MinLen
	if h.Checksum {
		clear(b[i : i+4])
		i += 4
	}
	if h.HasKey {
		binary.BigEndian.PutUint32(b[i:], h.Key)
		i += 4
	}
	if h.HasSeq {
		binary.BigEndian.PutUint32(b[i:], h.Seq)
	}
	if h.Checksum {
		binary.BigEndian.PutUint16(b[MinLen:], ^checksum(b))
	}
	return nil
}

// Packet is a GRE header and the packet it carries.
type Packet struct {
	Header
	// Payload aliases the decoded bytes.
	Payload []byte
}

// Decode reads a whole GRE packet from src; Payload aliases src.
func (p *Packet) Decode(src []byte) error {
	if len(src) > MaxPacket {
		return fail(TooLong, MaxPacket, "%d bytes exceed the %d of one datagram", len(src), MaxPacket)
	}
	if len(src) < MinLen {
		return fail(Short, len(src), "%d bytes, want at least %d", len(src), MinLen)
	}
	flags := binary.BigEndian.Uint16(src)
	if v := flags & versionMask; v != 0 {
		return fail(BadVersion, 1, "version %d, want 0", v)
	}
	if r := flags & reservedMask; r != 0 {
		return fail(Reserved, 0, "reserved bits %#04x set", r)
	}
	h := Header{
		Protocol: binary.BigEndian.Uint16(src[2:]),
		Checksum: flags&flagChecksum != 0,
		HasKey:   flags&flagKey != 0,
		HasSeq:   flags&flagSeq != 0,
	}
	if h.Protocol != ProtoIPv4 && h.Protocol != ProtoIPv6 {
		return fail(BadProtocol, 2, "protocol type %#04x is not IPv4 or IPv6", h.Protocol)
	}
	n := h.Len()
	if len(src) < n {
		return fail(Short, len(src), "%d bytes, the flags ask for a header of %d", len(src), n)
	}
	i := MinLen
	if h.Checksum {
		if checksum(src) != 0xffff {
			return fail(BadChecksum, i, "checksum does not verify")
		}
		if r := binary.BigEndian.Uint16(src[i+2:]); r != 0 {
			return fail(Reserved, i+2, "reserved1 is %#04x, want 0", r)
		}
		i += 4
	}
	if h.HasKey {
		h.Key = binary.BigEndian.Uint32(src[i:])
		i += 4
	}
	if h.HasSeq {
		h.Seq = binary.BigEndian.Uint32(src[i:])
	}
	p.Header, p.Payload = h, src[n:]
	return nil
}

// Append appends the encoded packet to dst.
func (p *Packet) Append(dst []byte) ([]byte, error) {
	n := p.Len()
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	dst = append(dst, p.Payload...)
	if err := p.Put(dst[start:]); err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// checksum is the ones' complement sum of b as 16-bit words (RFC 1071),
// folded: 0xffff over a packet whose checksum field is right.
func checksum(b []byte) uint16 {
	var s uint32
	for len(b) >= 2 {
		s += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}
