package tsgu

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
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

// Vectors are written field by field from MS-TSGU 2.2.10; the client ones
// match what xfreerdp 2.11 sends (PAA handshake, NUL-terminated UTF-16 names).
var vectors = []struct {
	name string
	hex  string
	msg  Message
}{
	{"handshake request PAA", "0100 0000 0e000000 01 00 0000 0200",
		&HandshakeRequest{VerMajor: 1, ClientVersion: 0, ExtendedAuth: ExtAuthPAA}},
	{"handshake response", "0200 0000 12000000 00000000 01 00 0000 0200",
		&HandshakeResponse{VerMajor: 1, ExtendedAuth: ExtAuthPAA}},
	{"tunnel create no cookie", "0400 0000 10000000 0d000000 0000 0000",
		&TunnelCreate{Capabilities: CapQuarSOH | CapMessagingConsentSign | CapMessagingServiceMsg}},
	{"tunnel create cookie 'ab'", "0400 0000 18000000 01000000 0100 0000 0600 6100 6200 0000",
		&TunnelCreate{Capabilities: CapQuarSOH, PAACookie: []byte{'a', 0, 'b', 0, 0, 0}}},
	{"tunnel create reauth", "0400 0000 18000000 00000000 0200 0000 0807060504030201",
		&TunnelCreate{HasReauth: true, ReauthContext: 0x0102030405060708}},
	{"tunnel response id caps", "0500 0000 1a000000 0100 00000000 0300 0000 2a000000 0d000000",
		&TunnelResponse{ServerVersion: 1, HasTunnelID: true, TunnelID: 42, HasCaps: true, Capabilities: 0xd}},
	{"tunnel response consent", "0500 0000 18000000 0100 00000000 1000 0000 0400 6f00 0000",
		&TunnelResponse{ServerVersion: 1, HasConsent: true, ConsentMsg: "o"}},
	{"tunnel response refused", "0500 0000 12000000 0100 f85907 80 0000 0000",
		&TunnelResponse{ServerVersion: 1, StatusCode: EProxyCookieAuthenticationDenied}},
	{"tunnel auth client name", "0600 0000 12000000 0000 0600 7000 6300 0000",
		&TunnelAuth{ClientName: "pc"}},
	{"tunnel auth response", "0700 0000 18000000 00000000 0300 0000 00000080 1e000000",
		&TunnelAuthResponse{HasRedirFlags: true, RedirFlags: RedirEnableAll, HasIdleTimeout: true, IdleTimeoutMinutes: 30}},
	{"channel create", "0800 0000 16000000 01 00 3d0d 0300 0600 6800 3100 0000",
		&ChannelCreate{Resources: []string{"h1"}, Port: 3389, Protocol: ProtocolRDP}},
	{"channel response", "0900 0000 14000000 00000000 0100 0000 07000000",
		&ChannelResponse{HasChannelID: true, ChannelID: 7}},
	{"channel response refused", "0900 0000 10000000 da590780 0000 0000",
		&ChannelResponse{ErrorCode: EProxyRAPAccessDenied}},
	{"data", "0a00 0000 0d000000 0300 010203", &Data{Payload: []byte{1, 2, 3}}},
	{"service message", "0b00 0000 0e000000 0400 6800 0000", &ServiceMessage{Message: "h"}},
	{"reauth", "0c00 0000 10000000 0100000000000000", &ReauthMessage{ReauthContext: 1}},
	{"keepalive", "0d00 0000 08000000", &Keepalive{}},
	{"close channel", "1000 0000 0c000000 00000000", &CloseChannel{}},
	{"close channel response", "1100 0000 0c000000 ca040780", &CloseChannelResponse{StatusCode: EGracefulDisconnect}},
	{"extended auth", "0300 0000 10000000 00000000 0200 aabb", &ExtendedAuth{Blob: []byte{0xaa, 0xbb}}},
}

func TestVectors(t *testing.T) {
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			want := unhex(t, v.hex)
			got, err := v.msg.Append(nil)
			if err != nil {
				t.Fatalf("Append: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("Append:\n got %x\nwant %x", got, want)
			}
			m, err := Decode(want)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(m, v.msg) {
				t.Fatalf("Decode:\n got %#v\nwant %#v", m, v.msg)
			}
		})
	}
}

func TestCookieString(t *testing.T) {
	var m TunnelCreate
	m.SetCookieString("eyJ.tok")
	if got := m.CookieString(); got != "eyJ.tok" {
		t.Fatalf("CookieString = %q", got)
	}
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name, hex, reason string
	}{
		{"short header", "0100 0000 0e", "header needs 8"},
		{"length below header", "0100 0000 04000000", "shorter than header"},
		{"length over max", "0a00 0000 ffffff00", "over maximum"},
		{"length mismatch", "0d00 0000 09000000", "bytes given"},
		{"unknown type", "7700 0000 08000000", "unknown packet type"},
		{"truncated handshake", "0100 0000 0c000000 0100 0000", "extendedAuth needs 2"},
		{"trailing junk", "0100 0000 0f000000 01 00 0000 0200 ff", "trailing"},
		{"data length lies", "0a00 0000 0d000000 0900 010203", "data needs 9"},
		{"odd utf16", "0600 0000 0f000000 0000 0300 700063", "odd"},
		{"no resources", "0800 0000 0e000000 00 00 3d0d 0300", "numResources is 0"},
		{"unknown tunnel fields", "0400 0000 10000000 00000000 0800 0000", "unknown fieldsPresent"},
		{"cookie longer than packet", "0400 0000 12000000 00000000 0100 0000 ff00", "paaCookie needs 255"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(unhex(t, c.hex))
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("want *DecodeError, got %v", err)
			}
			if !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("error %q does not mention %q", err, c.reason)
			}
		})
	}
}

func TestSplit(t *testing.T) {
	a, _ := (&Keepalive{}).Append(nil)
	b, _ := AppendData(nil, []byte("hello"))
	stream := append(append([]byte{}, a...), b...)
	// Every prefix shorter than the first packet asks for more.
	for i := 0; i < len(a); i++ {
		p, n, err := Split(stream[:i])
		if p != nil || n != 0 || err != nil {
			t.Fatalf("prefix %d: got %x %d %v", i, p, n, err)
		}
	}
	p, n, err := Split(stream)
	if err != nil || n != len(a) || !bytes.Equal(p, a) {
		t.Fatalf("first: %x %d %v", p, n, err)
	}
	p, n, err = Split(stream[n:])
	if err != nil || n != len(b) || !bytes.Equal(p, b) {
		t.Fatalf("second: %x %d %v", p, n, err)
	}
	if _, _, err := Split(unhex(t, "0a00 0000 ffffffff")); err == nil {
		t.Fatal("oversized length accepted")
	}
}

func TestPutDataHeader(t *testing.T) {
	buf := make([]byte, DataHeaderLen+3)
	copy(buf[DataHeaderLen:], []byte{1, 2, 3})
	PutDataHeader(buf, 3)
	want, _ := AppendData(nil, []byte{1, 2, 3})
	if !bytes.Equal(buf, want) {
		t.Fatalf("got %x want %x", buf, want)
	}
}

func TestEncodeLimits(t *testing.T) {
	if _, err := AppendData(nil, make([]byte, MaxDataLen+1)); err == nil {
		t.Fatal("oversized data encoded")
	}
	if _, err := (&ChannelCreate{}).Append(nil); err == nil {
		t.Fatal("channel create with no resource encoded")
	}
	if _, err := (&ServiceMessage{Message: strings.Repeat("x", 40000)}).Append(nil); err == nil {
		t.Fatal("oversized string encoded")
	}
}

func TestHRESULT(t *testing.T) {
	if !EProxyRAPAccessDenied.Failed() || SOK.Failed() {
		t.Fatal("Failed wrong")
	}
	for code := range hresultNames {
		if code != SOK && !code.Failed() {
			t.Errorf("%s (0x%08X) lacks the high bit: FreeRDP would take it as success", code, uint32(code))
		}
	}
	if EProxyRAPAccessDenied.String() != "E_PROXY_RAP_ACCESSDENIED" || HRESULT(0x1234).String() != "HRESULT(0x00001234)" {
		t.Fatal("String wrong")
	}
}
