package tsgu

import "encoding/binary"

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
	fields := r.fields(TunnelFieldPAACookie | TunnelFieldReauth)
	m.HasReauth = fields&TunnelFieldReauth != 0
	if m.HasReauth {
		m.ReauthContext = r.u64("reauthTunnelContext")
	}
	m.PAACookie = r.optBlob(fields&TunnelFieldPAACookie != 0, "paaCookie")
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
	var err error
	if dst, err = appendOptBlob(dst, m.PAACookie, "paaCookie"); err != nil {
		return dst[:s], err
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
	fields := r.fields(TunnelRespFieldTunnelID | TunnelRespFieldCaps | TunnelRespFieldSOHReq | TunnelRespFieldConsentMsg)
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
	r.onlyKnown(fields, TunnelAuthFieldSOH)
	m.SOH = r.optBlob(fields&TunnelAuthFieldSOH != 0, "statementOfHealth")
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
	if dst, err = appendOptBlob(dst, m.SOH, "statementOfHealth"); err != nil {
		return dst[:s], err
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
	fields := r.fields(TunnelAuthRespFieldRedirFlags | TunnelAuthRespFieldIdleTimeout | TunnelAuthRespFieldSOHResponse)
	m.HasRedirFlags = fields&TunnelAuthRespFieldRedirFlags != 0
	if m.HasRedirFlags {
		m.RedirFlags = r.u32("redirFlags")
	}
	m.HasIdleTimeout = fields&TunnelAuthRespFieldIdleTimeout != 0
	if m.HasIdleTimeout {
		m.IdleTimeoutMinutes = r.u32("idleTimeout")
	}
	m.SOHResponse = r.optBlob(fields&TunnelAuthRespFieldSOHResponse != 0, "SoHResponse")
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
	var err error
	if dst, err = appendOptBlob(dst, m.SOHResponse, "SoHResponse"); err != nil {
		return dst[:s], err
	}
	return finish(dst, s, m.Type())
}
