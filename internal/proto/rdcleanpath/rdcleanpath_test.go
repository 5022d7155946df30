package rdcleanpath

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

func u16(v uint16) *uint16 { return &v }
func u8(v uint8) *uint8    { return &v }

// The byte vectors are the ones IronRDP's ironrdp-rdcleanpath tests
// publish, so both ends agree on the encoding.
var vectors = []struct {
	name string
	pdu  *PDU
	der  string
}{
	{"request", &PDU{Version: Version, Destination: "destination", ProxyAuth: "proxy auth", PreconnectionBlob: "PCB", X224: []byte{0xde, 0xad, 0xbe, 0xff}},
		`3032 a0040202 0d3e a20d0c0b 64657374696e6174696f6e a30c0c0a 70726f78792061757468 a5050c03 504342 a6060404 deadbeff`},
	{"response", Response([]byte{0xde, 0xad, 0xbe, 0xff}, [][]byte{{0xde, 0xad, 0xbe, 0xff}, {0xde, 0xad, 0xbe, 0xff}, {0xde, 0xad, 0xbe, 0xff}}, "192.168.7.95"),
		`3034 a0040202 0d3e a6060404 deadbeff a7143012 0404deadbeff 0404deadbeff 0404deadbeff a90e0c0c 3139322e3136382e372e3935`},
	{"HTTP error", HTTPError(500),
		`3015 a0040202 0d3e a10d300b a0030201 01 a1040202 01f4`},
	{"TLS error", &PDU{Version: Version, Error: &Error{Code: GeneralError, TLSAlert: u8(48)}},
		`3014 a0040202 0d3e a10c300a a0030201 01 a3030201 30`},
}

func TestVectors(t *testing.T) {
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			want := unhex(t, v.der)
			got, err := v.pdu.Append(nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoded\n%x\nwant\n%x", got, want)
			}
			p, err := Decode(want)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, v.pdu) {
				t.Fatalf("decoded %+v, want %+v", p, v.pdu)
			}
			n, err := Len(want, 1<<16)
			if err != nil || n != len(want) {
				t.Fatalf("Len = %d, %v; want %d", n, err, len(want))
			}
		})
	}
}

func TestErrorFieldsRoundTrip(t *testing.T) {
	p := &PDU{Version: Version, Error: &Error{Code: NegotiationError, HTTPStatus: u16(403), WSAError: u16(10061), TLSAlert: u8(0)}, X224: []byte{}}
	b, err := p.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	q, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p, q) {
		t.Fatalf("decoded %+v, want %+v", q, p)
	}
	if got := q.Error.Error(); got != "rdcleanpath: error code 2, HTTP 403, WSA error 10061, TLS alert 0" {
		t.Errorf("message %q", got)
	}
}

func TestLen(t *testing.T) {
	long := &PDU{Version: Version, ProxyAuth: strings.Repeat("t", 5000)}
	b, _ := long.Append(nil)
	for _, c := range []struct {
		name string
		in   []byte
		max  int
		n    int
		err  error
	}{
		{"empty", nil, 100, 0, ErrShort},
		{"tag only", []byte{0x30}, 100, 0, ErrShort},
		{"long form cut", b[:3], 1 << 16, 0, ErrShort},
		{"long form", b[:4], 1 << 16, len(b), nil},
		{"over the limit", b[:4], 4096, 0, errors.New("limit")},
		{"not a sequence", []byte{0x16, 0x03, 0x01}, 100, 0, errors.New("sequence")},
		{"length not shortest", []byte{0x30, 0x81, 0x10}, 100, 0, errors.New("shortest")},
		{"indefinite length", []byte{0x30, 0x80}, 100, 0, errors.New("indefinite")},
	} {
		n, err := Len(c.in, c.max)
		if n != c.n || (err == nil) != (c.err == nil) || (errors.Is(c.err, ErrShort) && !errors.Is(err, ErrShort)) {
			t.Errorf("%s: Len = %d, %v; want %d, %v", c.name, n, err, c.n, c.err)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	req := unhex(t, vectors[0].der)
	for _, c := range []struct{ name, der string }{
		{"no version", `3000`},
		{"fields out of order", `3018 a0040202 0d3e a30c0c0a 70726f78792061757468 a2020c00`},
		{"repeated field", `3014 a0040202 0d3e a2050c03 616263 a2050c03 616263`},
		{"string of the wrong type", `300f a0040202 0d3e a2070403 616263 0000`},
		{"invalid UTF-8", `300d a0040202 0d3e a2050c03 61ff63`},
		{"universal tag among fields", `300c a0040202 0d3e 0c03 616263`},
		{"error code too large", `3016 a0040202 0d3e a10e300c a0050203 010000 a1030201 01`},
	} {
		if p, err := Decode(unhex(t, c.der)); err == nil {
			t.Errorf("%s: decoded %+v", c.name, p)
		}
	}
	for i := 1; i < len(req); i++ {
		if _, err := Decode(req[:i]); err == nil {
			t.Errorf("decoded the request cut to %d of %d bytes", i, len(req))
		}
	}
	if _, err := Decode(append(req, 0)); err == nil {
		t.Error("decoded a request with a trailing byte")
	}
}

// TestUnknownFieldSkipped: a field a later version adds is not an error.
func TestUnknownFieldSkipped(t *testing.T) {
	// [8] INTEGER 7, then [9] "1234".
	b := unhex(t, `3013 a0040202 0d3e a8030201 07 a9060c04 31323334`)
	p, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if p.ServerAddr != "1234" {
		t.Errorf("server_addr %q", p.ServerAddr)
	}
}

// FuzzDecode: whatever decodes re-encodes to bytes that decode to the
// same PDU, and Len agrees with the length of every decodable input.
func FuzzDecode(f *testing.F) {
	for _, v := range vectors {
		f.Add(unhex(f, v.der))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Decode(b)
		if err != nil {
			return
		}
		n, err := Len(b, 1<<20)
		if err != nil || n != len(b) {
			t.Fatalf("Decode took %d bytes, Len says %d, %v", len(b), n, err)
		}
		if p.Error != nil && p.Error.Error() == "" {
			t.Fatal("empty error message")
		}
		out, err := p.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		q, err := Decode(out)
		if err != nil {
			t.Fatalf("re-encoded PDU does not decode: %v", err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip changed %+v into %+v", p, q)
		}
	})
}
