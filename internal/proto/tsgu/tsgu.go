// Package tsgu encodes and decodes the packets of the MS-TSGU HTTP transport
// (the RD Gateway protocol spoken over websocket or the RDG_IN_DATA /
// RDG_OUT_DATA pair). It is pure: no I/O, no goroutines, no package state.
//
// Every packet starts with an 8-byte little-endian header (type, reserved,
// total length). Each message type has Decode(body) for the bytes after the
// header and Append(dst) that writes header and body. Lengths are checked
// against what remains and against MaxPacketLen before anything is read.
package tsgu

import (
	"encoding/binary"
	"fmt"
)

// PacketType is the packetType field of HTTP_PACKET_HEADER.
type PacketType uint16

// Packet types (MS-TSGU 2.2.5.3.3).
const (
	TypeHandshakeRequest     PacketType = 0x01
	TypeHandshakeResponse    PacketType = 0x02
	TypeExtendedAuth         PacketType = 0x03
	TypeTunnelCreate         PacketType = 0x04
	TypeTunnelResponse       PacketType = 0x05
	TypeTunnelAuth           PacketType = 0x06
	TypeTunnelAuthResponse   PacketType = 0x07
	TypeChannelCreate        PacketType = 0x08
	TypeChannelResponse      PacketType = 0x09
	TypeData                 PacketType = 0x0A
	TypeServiceMessage       PacketType = 0x0B
	TypeReauthMessage        PacketType = 0x0C
	TypeKeepalive            PacketType = 0x0D
	TypeCloseChannel         PacketType = 0x10
	TypeCloseChannelResponse PacketType = 0x11
)

var typeNames = map[PacketType]string{
	TypeHandshakeRequest:     "PKT_TYPE_HANDSHAKE_REQUEST",
	TypeHandshakeResponse:    "PKT_TYPE_HANDSHAKE_RESPONSE",
	TypeExtendedAuth:         "PKT_TYPE_EXTENDED_AUTH_MSG",
	TypeTunnelCreate:         "PKT_TYPE_TUNNEL_CREATE",
	TypeTunnelResponse:       "PKT_TYPE_TUNNEL_RESPONSE",
	TypeTunnelAuth:           "PKT_TYPE_TUNNEL_AUTH",
	TypeTunnelAuthResponse:   "PKT_TYPE_TUNNEL_AUTH_RESPONSE",
	TypeChannelCreate:        "PKT_TYPE_CHANNEL_CREATE",
	TypeChannelResponse:      "PKT_TYPE_CHANNEL_RESPONSE",
	TypeData:                 "PKT_TYPE_DATA",
	TypeServiceMessage:       "PKT_TYPE_SERVICE_MESSAGE",
	TypeReauthMessage:        "PKT_TYPE_REAUTH_MESSAGE",
	TypeKeepalive:            "PKT_TYPE_KEEPALIVE",
	TypeCloseChannel:         "PKT_TYPE_CLOSE_CHANNEL",
	TypeCloseChannelResponse: "PKT_TYPE_CLOSE_CHANNEL_RESPONSE",
}

// String returns the spec's name for t.
func (t PacketType) String() string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("PKT_TYPE_UNKNOWN(0x%x)", uint16(t))
}

// HeaderLen is the size of HTTP_PACKET_HEADER.
const HeaderLen = 8

// MaxPacketLen bounds any packet this codec accepts. The largest legal
// packet is a tunnel create with a 64 KiB PAA cookie plus its fixed fields;
// anything longer is garbage or an attack.
const MaxPacketLen = HeaderLen + 16 + 2 + 0xFFFF + 8

// MaxDataLen is the largest payload of one HTTP_DATA_PACKET (cbDataLen is 16 bits).
const MaxDataLen = 0xFFFF

// Header is HTTP_PACKET_HEADER.
type Header struct {
	Type   PacketType
	Length uint32 // whole packet, header included
}

// DecodeError says which packet failed to decode, where and why.
type DecodeError struct {
	Type   PacketType
	Offset int
	Reason string
}

// Error gives the packet type, the offset and what was wrong there.
func (e *DecodeError) Error() string {
	return fmt.Sprintf("tsgu: decode %s at offset %d: %s", e.Type, e.Offset, e.Reason)
}

// ParseHeader reads the header at the start of b.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, &DecodeError{Offset: 0, Reason: fmt.Sprintf("header needs %d bytes, have %d", HeaderLen, len(b))}
	}
	h := Header{Type: PacketType(binary.LittleEndian.Uint16(b)), Length: binary.LittleEndian.Uint32(b[4:])}
	if h.Length < HeaderLen {
		return h, &DecodeError{Type: h.Type, Offset: 4, Reason: fmt.Sprintf("packet length %d shorter than header", h.Length)}
	}
	if h.Length > MaxPacketLen {
		return h, &DecodeError{Type: h.Type, Offset: 4, Reason: fmt.Sprintf("packet length %d over maximum %d", h.Length, MaxPacketLen)}
	}
	return h, nil
}

// Split finds the first whole packet in buf. It returns the packet (header
// included, aliasing buf) and how many bytes it used, or n == 0 when more
// bytes are needed. A bad header is an error: the stream cannot be resynced.
func Split(buf []byte) (packet []byte, n int, err error) {
	if len(buf) < HeaderLen {
		return nil, 0, nil
	}
	h, err := ParseHeader(buf)
	if err != nil {
		return nil, 0, err
	}
	if len(buf) < int(h.Length) {
		return nil, 0, nil
	}
	return buf[:h.Length], int(h.Length), nil
}

// Message is one decoded packet.
type Message interface {
	// Type is the packet type written in the header.
	Type() PacketType
	// Decode parses the body (the bytes after the header).
	Decode(body []byte) error
	// Append writes the whole packet, header included, to dst.
	Append(dst []byte) ([]byte, error)
}

// New returns an empty message of type t, or nil for an unknown type.
func New(t PacketType) Message {
	switch t {
	case TypeHandshakeRequest:
		return &HandshakeRequest{}
	case TypeHandshakeResponse:
		return &HandshakeResponse{}
	case TypeExtendedAuth:
		return &ExtendedAuth{}
	case TypeTunnelCreate:
		return &TunnelCreate{}
	case TypeTunnelResponse:
		return &TunnelResponse{}
	case TypeTunnelAuth:
		return &TunnelAuth{}
	case TypeTunnelAuthResponse:
		return &TunnelAuthResponse{}
	case TypeChannelCreate:
		return &ChannelCreate{}
	case TypeChannelResponse:
		return &ChannelResponse{}
	case TypeData:
		return &Data{}
	case TypeServiceMessage:
		return &ServiceMessage{}
	case TypeReauthMessage:
		return &ReauthMessage{}
	case TypeKeepalive:
		return &Keepalive{}
	case TypeCloseChannel:
		return &CloseChannel{}
	case TypeCloseChannelResponse:
		return &CloseChannelResponse{}
	}
	return nil
}

// Decode parses one whole packet (header included). The returned message
// may alias packet (Data.Payload does).
func Decode(packet []byte) (Message, error) {
	h, err := ParseHeader(packet)
	if err != nil {
		return nil, err
	}
	if int(h.Length) != len(packet) {
		return nil, &DecodeError{Type: h.Type, Offset: 4, Reason: fmt.Sprintf("packet length %d but %d bytes given", h.Length, len(packet))}
	}
	m := New(h.Type)
	if m == nil {
		return nil, &DecodeError{Type: h.Type, Offset: 0, Reason: "unknown packet type"}
	}
	if err := m.Decode(packet[HeaderLen:]); err != nil {
		return nil, err
	}
	return m, nil
}

// appendHeader reserves the header; finish fills in the length once the body is written.
func appendHeader(dst []byte, t PacketType) ([]byte, int) {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(t))
	dst = append(dst, 0, 0, 0, 0, 0, 0)
	return dst, start
}

func finish(dst []byte, start int, t PacketType) ([]byte, error) {
	n := len(dst) - start
	if n > MaxPacketLen {
		return dst[:start], fmt.Errorf("tsgu: encode %s: packet length %d over maximum %d", t, n, MaxPacketLen)
	}
	binary.LittleEndian.PutUint32(dst[start+4:], uint32(n))
	return dst, nil
}
