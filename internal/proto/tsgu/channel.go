package tsgu

import (
	"encoding/binary"
	"fmt"
)

// ProtocolRDP is the only protocol value clients send in a channel create.
const ProtocolRDP uint16 = 3

// ChannelCreate is HTTP_CHANNEL_PACKET: the target resources and port.
type ChannelCreate struct {
	Resources    []string
	AltResources []string
	Port         uint16
	Protocol     uint16
}

// Type implements Message.
func (*ChannelCreate) Type() PacketType { return TypeChannelCreate }

// Decode implements Message.
func (m *ChannelCreate) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	nRes := r.u8("numResources")
	nAlt := r.u8("numAltResources")
	m.Port = r.u16("port")
	m.Protocol = r.u16("protocol")
	if r.err == nil && nRes == 0 {
		r.fail("numResources is 0: no target named")
	}
	m.Resources = make([]string, 0, nRes)
	for i := 0; i < int(nRes) && r.err == nil; i++ {
		m.Resources = append(m.Resources, r.unicodeString("resourceName"))
	}
	m.AltResources = nil
	for i := 0; i < int(nAlt) && r.err == nil; i++ {
		m.AltResources = append(m.AltResources, r.unicodeString("altResourceName"))
	}
	return r.done()
}

// Append implements Message.
func (m *ChannelCreate) Append(dst []byte) ([]byte, error) {
	if len(m.Resources) == 0 || len(m.Resources) > 255 || len(m.AltResources) > 255 {
		return dst, fmt.Errorf("tsgu: encode channel create: %d resources and %d alternates (need 1..255 and 0..255)", len(m.Resources), len(m.AltResources))
	}
	dst, s := appendHeader(dst, m.Type())
	dst = append(dst, uint8(len(m.Resources)), uint8(len(m.AltResources)))
	dst = binary.LittleEndian.AppendUint16(dst, m.Port)
	dst = binary.LittleEndian.AppendUint16(dst, m.Protocol)
	var err error
	for _, n := range m.Resources {
		if dst, err = appendUnicodeString(dst, n, "resourceName"); err != nil {
			return dst[:s], err
		}
	}
	for _, n := range m.AltResources {
		if dst, err = appendUnicodeString(dst, n, "altResourceName"); err != nil {
			return dst[:s], err
		}
	}
	return finish(dst, s, m.Type())
}

// ChannelResponse is HTTP_CHANNEL_RESPONSE.
type ChannelResponse struct {
	ErrorCode    HRESULT
	HasChannelID bool
	ChannelID    uint32
	HasUDPPort   bool
	UDPPort      uint16
	// AuthnCookie is nil when absent.
	AuthnCookie []byte
}

// Type implements Message.
func (*ChannelResponse) Type() PacketType { return TypeChannelResponse }

// Decode implements Message.
func (m *ChannelResponse) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.ErrorCode = HRESULT(r.u32("errorCode"))
	fields := r.fields(ChannelRespFieldChannelID | ChannelRespFieldAuthnCookie | ChannelRespFieldUDPPort)
	m.HasChannelID = fields&ChannelRespFieldChannelID != 0
	if m.HasChannelID {
		m.ChannelID = r.u32("channelId")
	}
	m.HasUDPPort = fields&ChannelRespFieldUDPPort != 0
	if m.HasUDPPort {
		m.UDPPort = r.u16("udpPort")
	}
	m.AuthnCookie = r.optBlob(fields&ChannelRespFieldAuthnCookie != 0, "authnCookie")
	return r.done()
}

// Append implements Message.
func (m *ChannelResponse) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	var fields uint16
	if m.HasChannelID {
		fields |= ChannelRespFieldChannelID
	}
	if m.HasUDPPort {
		fields |= ChannelRespFieldUDPPort
	}
	if m.AuthnCookie != nil {
		fields |= ChannelRespFieldAuthnCookie
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.ErrorCode))
	dst = binary.LittleEndian.AppendUint16(dst, fields)
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	if m.HasChannelID {
		dst = binary.LittleEndian.AppendUint32(dst, m.ChannelID)
	}
	if m.HasUDPPort {
		dst = binary.LittleEndian.AppendUint16(dst, m.UDPPort)
	}
	var err error
	if dst, err = appendOptBlob(dst, m.AuthnCookie, "authnCookie"); err != nil {
		return dst[:s], err
	}
	return finish(dst, s, m.Type())
}

// Data is HTTP_DATA_PACKET. Payload aliases the decoded buffer.
type Data struct {
	Payload []byte
}

// Type implements Message.
func (*Data) Type() PacketType { return TypeData }

// Decode implements Message.
func (m *Data) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	n := r.u16("cbDataLen")
	m.Payload = r.bytes(int(n), "data")
	return r.done()
}

// Append implements Message.
func (m *Data) Append(dst []byte) ([]byte, error) {
	return AppendData(dst, m.Payload)
}

// AppendData writes a data packet carrying payload without building a Data
// value; it is the relay's hot path.
func AppendData(dst, payload []byte) ([]byte, error) {
	if len(payload) > MaxDataLen {
		return dst, fmt.Errorf("tsgu: encode data: payload %d bytes over %d", len(payload), MaxDataLen)
	}
	n := HeaderLen + 2 + len(payload)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(TypeData))
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(n))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(payload)))
	return append(dst, payload...), nil
}

// PutDataHeader writes the 10 bytes that precede a payload of n bytes into
// dst[:DataHeaderLen], so a relay can read straight into dst[DataHeaderLen:].
func PutDataHeader(dst []byte, n int) {
	binary.LittleEndian.PutUint16(dst, uint16(TypeData))
	binary.LittleEndian.PutUint16(dst[2:], 0)
	binary.LittleEndian.PutUint32(dst[4:], uint32(HeaderLen+2+n))
	binary.LittleEndian.PutUint16(dst[8:], uint16(n))
}

// DataHeaderLen is the packet header plus cbDataLen.
const DataHeaderLen = HeaderLen + 2

// ServiceMessage is HTTP_SERVICE_MESSAGE: an administrative message for the user.
type ServiceMessage struct {
	Message string
}

// Type implements Message.
func (*ServiceMessage) Type() PacketType { return TypeServiceMessage }

// Decode implements Message.
func (m *ServiceMessage) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.Message = r.unicodeString("message")
	return r.done()
}

// Append implements Message.
func (m *ServiceMessage) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	dst, err := appendUnicodeString(dst, m.Message, "message")
	if err != nil {
		return dst[:s], err
	}
	return finish(dst, s, m.Type())
}

// ReauthMessage is HTTP_REAUTH_MESSAGE: the server asks the client to reauthenticate.
type ReauthMessage struct {
	ReauthContext uint64
}

// Type implements Message.
func (*ReauthMessage) Type() PacketType { return TypeReauthMessage }

// Decode implements Message.
func (m *ReauthMessage) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.ReauthContext = r.u64("reauthTunnelContext")
	return r.done()
}

// Append implements Message.
func (m *ReauthMessage) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	dst = binary.LittleEndian.AppendUint64(dst, m.ReauthContext)
	return finish(dst, s, m.Type())
}

// Keepalive is a header-only keepalive packet.
type Keepalive struct{}

// Type implements Message.
func (*Keepalive) Type() PacketType { return TypeKeepalive }

// Decode implements Message. Clients have been seen padding keepalives, so
// any body is accepted and ignored.
func (*Keepalive) Decode(b []byte) error { return nil }

// Append implements Message.
func (m *Keepalive) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	return finish(dst, s, m.Type())
}

// CloseChannel is HTTP_CLOSE_PACKET (type PKT_TYPE_CLOSE_CHANNEL).
type CloseChannel struct {
	StatusCode HRESULT
}

// Type implements Message.
func (*CloseChannel) Type() PacketType { return TypeCloseChannel }

// Decode implements Message.
func (m *CloseChannel) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.StatusCode = HRESULT(r.u32("statusCode"))
	return r.done()
}

// Append implements Message.
func (m *CloseChannel) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.StatusCode))
	return finish(dst, s, m.Type())
}

// CloseChannelResponse is HTTP_CLOSE_PACKET (type PKT_TYPE_CLOSE_CHANNEL_RESPONSE).
type CloseChannelResponse struct {
	StatusCode HRESULT
}

// Type implements Message.
func (*CloseChannelResponse) Type() PacketType { return TypeCloseChannelResponse }

// Decode implements Message.
func (m *CloseChannelResponse) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.StatusCode = HRESULT(r.u32("statusCode"))
	return r.done()
}

// Append implements Message.
func (m *CloseChannelResponse) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.StatusCode))
	return finish(dst, s, m.Type())
}
