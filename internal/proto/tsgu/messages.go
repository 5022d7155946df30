package tsgu

import (
	"encoding/binary"
	"fmt"
)

// Extended authentication methods (HTTP_EXTENDED_AUTH, MS-TSGU 2.2.5.3.2).
const (
	ExtAuthNone      uint16 = 0x0
	ExtAuthSmartCard uint16 = 0x1
	ExtAuthPAA       uint16 = 0x2
	ExtAuthSSPINTLM  uint16 = 0x4
)

// Capability flags (HTTP_CAPABILITY_TYPE, MS-TSGU 2.2.5.3.1).
const (
	CapQuarSOH              uint32 = 0x01
	CapIdleTimeout          uint32 = 0x02
	CapMessagingConsentSign uint32 = 0x04
	CapMessagingServiceMsg  uint32 = 0x08
	CapReauth               uint32 = 0x10
	CapUDPTransport         uint32 = 0x20
)

// Tunnel create fields present.
const (
	TunnelFieldPAACookie uint16 = 0x1
	TunnelFieldReauth    uint16 = 0x2
)

// Tunnel response fields present.
const (
	TunnelRespFieldTunnelID   uint16 = 0x01
	TunnelRespFieldCaps       uint16 = 0x02
	TunnelRespFieldSOHReq     uint16 = 0x04
	TunnelRespFieldConsentMsg uint16 = 0x10
)

// Tunnel auth fields present.
const TunnelAuthFieldSOH uint16 = 0x1

// Tunnel auth response fields present.
const (
	TunnelAuthRespFieldRedirFlags  uint16 = 0x1
	TunnelAuthRespFieldIdleTimeout uint16 = 0x2
	TunnelAuthRespFieldSOHResponse uint16 = 0x4
)

// Device redirection flags in the tunnel auth response.
const (
	RedirEnableAll        uint32 = 0x80000000
	RedirDisableAll       uint32 = 0x40000000
	RedirDisableDrive     uint32 = 0x01
	RedirDisablePrinter   uint32 = 0x02
	RedirDisablePort      uint32 = 0x04
	RedirDisableClipboard uint32 = 0x08
	RedirDisablePnP       uint32 = 0x10
)

// Channel response fields present.
const (
	ChannelRespFieldChannelID   uint16 = 0x1
	ChannelRespFieldAuthnCookie uint16 = 0x2
	ChannelRespFieldUDPPort     uint16 = 0x4
)

// HandshakeRequest is HTTP_HANDSHAKE_REQUEST_PACKET.
type HandshakeRequest struct {
	VerMajor, VerMinor uint8
	ClientVersion      uint16
	ExtendedAuth       uint16
}

// Type implements Message.
func (*HandshakeRequest) Type() PacketType { return TypeHandshakeRequest }

// Decode implements Message.
func (m *HandshakeRequest) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.VerMajor = r.u8("verMajor")
	m.VerMinor = r.u8("verMinor")
	m.ClientVersion = r.u16("clientVersion")
	m.ExtendedAuth = r.u16("extendedAuth")
	return r.done()
}

// Append implements Message.
func (m *HandshakeRequest) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	dst = append(dst, m.VerMajor, m.VerMinor)
	dst = binary.LittleEndian.AppendUint16(dst, m.ClientVersion)
	dst = binary.LittleEndian.AppendUint16(dst, m.ExtendedAuth)
	return finish(dst, s, m.Type())
}

// HandshakeResponse is HTTP_HANDSHAKE_RESPONSE_PACKET.
type HandshakeResponse struct {
	ErrorCode          HRESULT
	VerMajor, VerMinor uint8
	ServerVersion      uint16
	ExtendedAuth       uint16
}

// Type implements Message.
func (*HandshakeResponse) Type() PacketType { return TypeHandshakeResponse }

// Decode implements Message.
func (m *HandshakeResponse) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.ErrorCode = HRESULT(r.u32("errorCode"))
	m.VerMajor = r.u8("verMajor")
	m.VerMinor = r.u8("verMinor")
	m.ServerVersion = r.u16("serverVersion")
	m.ExtendedAuth = r.u16("extendedAuth")
	return r.done()
}

// Append implements Message.
func (m *HandshakeResponse) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.ErrorCode))
	dst = append(dst, m.VerMajor, m.VerMinor)
	dst = binary.LittleEndian.AppendUint16(dst, m.ServerVersion)
	dst = binary.LittleEndian.AppendUint16(dst, m.ExtendedAuth)
	return finish(dst, s, m.Type())
}

// ExtendedAuth is HTTP_EXTENDED_AUTH_PACKET (SSPI NTLM inside the tunnel).
type ExtendedAuth struct {
	ErrorCode HRESULT
	Blob      []byte
}

// Type implements Message.
func (*ExtendedAuth) Type() PacketType { return TypeExtendedAuth }

// Decode implements Message.
func (m *ExtendedAuth) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.ErrorCode = HRESULT(r.u32("errorCode"))
	m.Blob = r.blob("authBlob")
	return r.done()
}

// Append implements Message.
func (m *ExtendedAuth) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.ErrorCode))
	dst, err := appendBlob(dst, m.Blob, "authBlob")
	if err != nil {
		return dst[:s], err
	}
	return finish(dst, s, m.Type())
}

// TunnelCreate is HTTP_TUNNEL_PACKET with its optional fields.
type TunnelCreate struct {
	Capabilities uint32
	// ReauthContext is present when HasReauth.
	HasReauth     bool
	ReauthContext uint64
	// PAACookie is the raw cookie bytes (UTF-16LE from real clients); nil when absent.
	PAACookie []byte
}

// Type implements Message.
func (*TunnelCreate) Type() PacketType { return TypeTunnelCreate }

// Decode implements Message.
func (m *TunnelCreate) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.Capabilities = r.u32("capsFlags")
	fields := r.u16("fieldsPresent")
	r.u16("reserved")
	if fields&^(TunnelFieldPAACookie|TunnelFieldReauth) != 0 {
		r.fail(fmt.Sprintf("unknown fieldsPresent bits 0x%x", fields))
	}
	m.HasReauth = fields&TunnelFieldReauth != 0
	if m.HasReauth {
		m.ReauthContext = r.u64("reauthTunnelContext")
	}
	m.PAACookie = nil
	if fields&TunnelFieldPAACookie != 0 {
		m.PAACookie = r.blob("paaCookie")
		if m.PAACookie == nil && r.err == nil {
			m.PAACookie = []byte{}
		}
	}
	return r.done()
}

// Append implements Message.
func (m *TunnelCreate) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	var fields uint16
	if m.PAACookie != nil {
		fields |= TunnelFieldPAACookie
	}
	if m.HasReauth {
		fields |= TunnelFieldReauth
	}
	dst = binary.LittleEndian.AppendUint32(dst, m.Capabilities)
	dst = binary.LittleEndian.AppendUint16(dst, fields)
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	if m.HasReauth {
		dst = binary.LittleEndian.AppendUint64(dst, m.ReauthContext)
	}
	if m.PAACookie != nil {
		var err error
		if dst, err = appendBlob(dst, m.PAACookie, "paaCookie"); err != nil {
			return dst[:s], err
		}
	}
	return finish(dst, s, m.Type())
}

// CookieString decodes the PAA cookie the way real clients send it: UTF-16LE
// with a trailing NUL. A cookie that is not valid UTF-16 is returned as is.
func (m *TunnelCreate) CookieString() string {
	if len(m.PAACookie)%2 != 0 {
		return string(m.PAACookie)
	}
	return decodeUTF16(m.PAACookie)
}

// SetCookieString stores s as a UTF-16LE cookie with its NUL, as xfreerdp does.
func (m *TunnelCreate) SetCookieString(s string) {
	m.PAACookie = appendUTF16(nil, s)
}

// TunnelResponse is HTTP_TUNNEL_RESPONSE with its optional fields.
type TunnelResponse struct {
	ServerVersion uint16
	StatusCode    HRESULT
	HasTunnelID   bool
	TunnelID      uint32
	HasCaps       bool
	Capabilities  uint32
	// HasSOHReq carries a 20-byte nonce and the server certificate.
	HasSOHReq  bool
	Nonce      [20]byte
	ServerCert string
	ConsentMsg string
	HasConsent bool
}

// Type implements Message.
func (*TunnelResponse) Type() PacketType { return TypeTunnelResponse }

// Decode implements Message.
func (m *TunnelResponse) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.ServerVersion = r.u16("serverVersion")
	m.StatusCode = HRESULT(r.u32("statusCode"))
	fields := r.u16("fieldsPresent")
	r.u16("reserved")
	known := TunnelRespFieldTunnelID | TunnelRespFieldCaps | TunnelRespFieldSOHReq | TunnelRespFieldConsentMsg
	if fields&^known != 0 {
		r.fail(fmt.Sprintf("unknown fieldsPresent bits 0x%x", fields))
	}
	m.HasTunnelID = fields&TunnelRespFieldTunnelID != 0
	if m.HasTunnelID {
		m.TunnelID = r.u32("tunnelId")
	}
	m.HasCaps = fields&TunnelRespFieldCaps != 0
	if m.HasCaps {
		m.Capabilities = r.u32("capsFlags")
	}
	m.HasSOHReq = fields&TunnelRespFieldSOHReq != 0
	if m.HasSOHReq {
		copy(m.Nonce[:], r.bytes(20, "nonce"))
		m.ServerCert = r.unicodeString("serverCert")
	}
	m.HasConsent = fields&TunnelRespFieldConsentMsg != 0
	if m.HasConsent {
		m.ConsentMsg = r.unicodeString("consentMsg")
	}
	return r.done()
}

// Append implements Message.
func (m *TunnelResponse) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	var fields uint16
	if m.HasTunnelID {
		fields |= TunnelRespFieldTunnelID
	}
	if m.HasCaps {
		fields |= TunnelRespFieldCaps
	}
	if m.HasSOHReq {
		fields |= TunnelRespFieldSOHReq
	}
	if m.HasConsent {
		fields |= TunnelRespFieldConsentMsg
	}
	dst = binary.LittleEndian.AppendUint16(dst, m.ServerVersion)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.StatusCode))
	dst = binary.LittleEndian.AppendUint16(dst, fields)
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	if m.HasTunnelID {
		dst = binary.LittleEndian.AppendUint32(dst, m.TunnelID)
	}
	if m.HasCaps {
		dst = binary.LittleEndian.AppendUint32(dst, m.Capabilities)
	}
	var err error
	if m.HasSOHReq {
		dst = append(dst, m.Nonce[:]...)
		if dst, err = appendUnicodeString(dst, m.ServerCert, "serverCert"); err != nil {
			return dst[:s], err
		}
	}
	if m.HasConsent {
		if dst, err = appendUnicodeString(dst, m.ConsentMsg, "consentMsg"); err != nil {
			return dst[:s], err
		}
	}
	return finish(dst, s, m.Type())
}

// TunnelAuth is HTTP_TUNNEL_AUTH_PACKET.
type TunnelAuth struct {
	ClientName string
	// SOH is the statement of health blob; nil when absent.
	SOH []byte
}

// Type implements Message.
func (*TunnelAuth) Type() PacketType { return TypeTunnelAuth }

// Decode implements Message.
func (m *TunnelAuth) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	fields := r.u16("fieldsPresent")
	n := r.u16("cbClientName")
	m.ClientName = r.utf16(int(n), "clientName")
	if fields&^TunnelAuthFieldSOH != 0 {
		r.fail(fmt.Sprintf("unknown fieldsPresent bits 0x%x", fields))
	}
	m.SOH = nil
	if fields&TunnelAuthFieldSOH != 0 {
		m.SOH = r.blob("statementOfHealth")
		if m.SOH == nil && r.err == nil {
			m.SOH = []byte{}
		}
	}
	return r.done()
}

// Append implements Message.
func (m *TunnelAuth) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	var fields uint16
	if m.SOH != nil {
		fields |= TunnelAuthFieldSOH
	}
	dst = binary.LittleEndian.AppendUint16(dst, fields)
	var err error
	if dst, err = appendUnicodeString(dst, m.ClientName, "clientName"); err != nil {
		return dst[:s], err
	}
	if m.SOH != nil {
		if dst, err = appendBlob(dst, m.SOH, "statementOfHealth"); err != nil {
			return dst[:s], err
		}
	}
	return finish(dst, s, m.Type())
}

// TunnelAuthResponse is HTTP_TUNNEL_AUTH_RESPONSE.
type TunnelAuthResponse struct {
	ErrorCode      HRESULT
	HasRedirFlags  bool
	RedirFlags     uint32
	HasIdleTimeout bool
	// IdleTimeoutMinutes is the idle timeout the client should apply, in minutes.
	IdleTimeoutMinutes uint32
	// SOHResponse is nil when absent.
	SOHResponse []byte
}

// Type implements Message.
func (*TunnelAuthResponse) Type() PacketType { return TypeTunnelAuthResponse }

// Decode implements Message.
func (m *TunnelAuthResponse) Decode(b []byte) error {
	r := reader{t: m.Type(), b: b}
	m.ErrorCode = HRESULT(r.u32("errorCode"))
	fields := r.u16("fieldsPresent")
	r.u16("reserved")
	known := TunnelAuthRespFieldRedirFlags | TunnelAuthRespFieldIdleTimeout | TunnelAuthRespFieldSOHResponse
	if fields&^known != 0 {
		r.fail(fmt.Sprintf("unknown fieldsPresent bits 0x%x", fields))
	}
	m.HasRedirFlags = fields&TunnelAuthRespFieldRedirFlags != 0
	if m.HasRedirFlags {
		m.RedirFlags = r.u32("redirFlags")
	}
	m.HasIdleTimeout = fields&TunnelAuthRespFieldIdleTimeout != 0
	if m.HasIdleTimeout {
		m.IdleTimeoutMinutes = r.u32("idleTimeout")
	}
	m.SOHResponse = nil
	if fields&TunnelAuthRespFieldSOHResponse != 0 {
		m.SOHResponse = r.blob("SoHResponse")
		if m.SOHResponse == nil && r.err == nil {
			m.SOHResponse = []byte{}
		}
	}
	return r.done()
}

// Append implements Message.
func (m *TunnelAuthResponse) Append(dst []byte) ([]byte, error) {
	dst, s := appendHeader(dst, m.Type())
	var fields uint16
	if m.HasRedirFlags {
		fields |= TunnelAuthRespFieldRedirFlags
	}
	if m.HasIdleTimeout {
		fields |= TunnelAuthRespFieldIdleTimeout
	}
	if m.SOHResponse != nil {
		fields |= TunnelAuthRespFieldSOHResponse
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.ErrorCode))
	dst = binary.LittleEndian.AppendUint16(dst, fields)
	dst = binary.LittleEndian.AppendUint16(dst, 0)
	if m.HasRedirFlags {
		dst = binary.LittleEndian.AppendUint32(dst, m.RedirFlags)
	}
	if m.HasIdleTimeout {
		dst = binary.LittleEndian.AppendUint32(dst, m.IdleTimeoutMinutes)
	}
	if m.SOHResponse != nil {
		var err error
		if dst, err = appendBlob(dst, m.SOHResponse, "SoHResponse"); err != nil {
			return dst[:s], err
		}
	}
	return finish(dst, s, m.Type())
}

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
	fields := r.u16("fieldsPresent")
	r.u16("reserved")
	known := ChannelRespFieldChannelID | ChannelRespFieldAuthnCookie | ChannelRespFieldUDPPort
	if fields&^known != 0 {
		r.fail(fmt.Sprintf("unknown fieldsPresent bits 0x%x", fields))
	}
	m.HasChannelID = fields&ChannelRespFieldChannelID != 0
	if m.HasChannelID {
		m.ChannelID = r.u32("channelId")
	}
	m.HasUDPPort = fields&ChannelRespFieldUDPPort != 0
	if m.HasUDPPort {
		m.UDPPort = r.u16("udpPort")
	}
	m.AuthnCookie = nil
	if fields&ChannelRespFieldAuthnCookie != 0 {
		m.AuthnCookie = r.blob("authnCookie")
		if m.AuthnCookie == nil && r.err == nil {
			m.AuthnCookie = []byte{}
		}
	}
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
	if m.AuthnCookie != nil {
		var err error
		if dst, err = appendBlob(dst, m.AuthnCookie, "authnCookie"); err != nil {
			return dst[:s], err
		}
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
