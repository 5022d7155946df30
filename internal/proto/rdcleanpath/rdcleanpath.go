// Package rdcleanpath encodes and decodes RDCleanPath PDUs, the framing a
// browser RDP client (IronRDP's web client) speaks to a gateway over a
// websocket: the client sends one request naming the host, its token and
// its X.224 Connection Request; the gateway connects, does TLS with the
// host itself and answers with the host's X.224 Connection Confirm and
// certificate chain, or with an error. After that exchange the websocket
// carries plain RDP, which the gateway relays into its TLS session with
// the host.
//
// A PDU is a DER SEQUENCE whose fields all carry EXPLICIT context tags:
//
//	[0] version INTEGER (3390)
//	[1] error SEQUENCE { [0] code, [1] HTTP status, [2] WSA error, [3] TLS alert } OPTIONAL
//	[2] destination UTF8String OPTIONAL
//	[3] proxy_auth UTF8String OPTIONAL
//	[4] server_auth UTF8String OPTIONAL
//	[5] preconnection_blob UTF8String OPTIONAL
//	[6] x224_connection_pdu OCTET STRING OPTIONAL
//	[7] server_cert_chain SEQUENCE OF OCTET STRING OPTIONAL
//	[9] server_addr UTF8String OPTIONAL
//
// The package does no I/O.
package rdcleanpath

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"golang.org/x/crypto/cryptobyte"
	"golang.org/x/crypto/cryptobyte/asn1"
)

// Version is the only PDU version in use (3389 + 1).
const Version = 3390

// Error codes of an error PDU.
const (
	GeneralError     = 1
	NegotiationError = 2
)

// Error is the gateway's refusal. Its optional fields are nil when absent.
type Error struct {
	Code       uint16
	HTTPStatus *uint16
	WSAError   *uint16
	TLSAlert   *uint8
}

// Error implements error.
func (e *Error) Error() string {
	s := fmt.Sprintf("rdcleanpath: error code %d", e.Code)
	if e.HTTPStatus != nil {
		s += fmt.Sprintf(", HTTP %d", *e.HTTPStatus)
	}
	if e.WSAError != nil {
		s += fmt.Sprintf(", WSA error %d", *e.WSAError)
	}
	if e.TLSAlert != nil {
		s += fmt.Sprintf(", TLS alert %d", *e.TLSAlert)
	}
	return s
}

// PDU is one RDCleanPath message. Empty strings and nil slices are absent
// fields.
type PDU struct {
	Version           uint64
	Error             *Error
	Destination       string
	ProxyAuth         string
	ServerAuth        string
	PreconnectionBlob string
	X224              []byte
	ServerCertChain   [][]byte
	ServerAddr        string
}

// HTTPError is an error PDU carrying an HTTP status, which IronRDP's
// client shows as the reason (401: the token; 403: a policy; 502: the host).
func HTTPError(status uint16) *PDU {
	return &PDU{Version: Version, Error: &Error{Code: GeneralError, HTTPStatus: &status}}
}

// Response is the success PDU: the host's Connection Confirm, its
// certificate chain (leaf first, DER) and the address the gateway reached.
func Response(x224 []byte, chain [][]byte, serverAddr string) *PDU {
	return &PDU{Version: Version, X224: x224, ServerCertChain: chain, ServerAddr: serverAddr}
}

func ctx(n int) asn1.Tag { return asn1.Tag(n).ContextSpecific().Constructed() }

// Append encodes p as DER after dst.
func (p *PDU) Append(dst []byte) ([]byte, error) {
	b := cryptobyte.NewBuilder(dst)
	b.AddASN1(asn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1(ctx(0), func(b *cryptobyte.Builder) { b.AddASN1Uint64(p.Version) })
		if e := p.Error; e != nil {
			b.AddASN1(ctx(1), func(b *cryptobyte.Builder) {
				b.AddASN1(asn1.SEQUENCE, func(b *cryptobyte.Builder) {
					b.AddASN1(ctx(0), func(b *cryptobyte.Builder) { b.AddASN1Uint64(uint64(e.Code)) })
					if e.HTTPStatus != nil {
						b.AddASN1(ctx(1), func(b *cryptobyte.Builder) { b.AddASN1Uint64(uint64(*e.HTTPStatus)) })
					}
					if e.WSAError != nil {
						b.AddASN1(ctx(2), func(b *cryptobyte.Builder) { b.AddASN1Uint64(uint64(*e.WSAError)) })
					}
					if e.TLSAlert != nil {
						b.AddASN1(ctx(3), func(b *cryptobyte.Builder) { b.AddASN1Uint64(uint64(*e.TLSAlert)) })
					}
				})
			})
		}
		for _, f := range []struct {
			tag int
			s   string
		}{{2, p.Destination}, {3, p.ProxyAuth}, {4, p.ServerAuth}, {5, p.PreconnectionBlob}} {
			if f.s != "" {
				addString(b, f.tag, f.s)
			}
		}
		if p.X224 != nil {
			b.AddASN1(ctx(6), func(b *cryptobyte.Builder) { b.AddASN1OctetString(p.X224) })
		}
		if p.ServerCertChain != nil {
			b.AddASN1(ctx(7), func(b *cryptobyte.Builder) {
				b.AddASN1(asn1.SEQUENCE, func(b *cryptobyte.Builder) {
					for _, c := range p.ServerCertChain {
						b.AddASN1OctetString(c)
					}
				})
			})
		}
		if p.ServerAddr != "" {
			addString(b, 9, p.ServerAddr)
		}
	})
	out, err := b.Bytes()
	if err != nil {
		return dst, fmt.Errorf("rdcleanpath: encode: %w", err)
	}
	return out, nil
}

func addString(b *cryptobyte.Builder, tag int, s string) {
	b.AddASN1(ctx(tag), func(b *cryptobyte.Builder) {
		b.AddASN1(asn1.UTF8String, func(b *cryptobyte.Builder) { b.AddBytes([]byte(s)) })
	})
}

// ErrShort is Len's answer when buf does not yet hold a PDU's header.
var ErrShort = errors.New("rdcleanpath: more bytes needed")

// Len returns the length of the PDU that starts buf, from its DER header
// alone, so a reader knows how much to wait for; a PDU longer than max is
// an error. It returns ErrShort when the header itself is incomplete.
func Len(buf []byte, max int) (int, error) {
	if len(buf) < 2 {
		return 0, ErrShort
	}
	if buf[0] != 0x30 {
		return 0, fmt.Errorf("rdcleanpath: PDU starts with 0x%02x, not a DER SEQUENCE", buf[0])
	}
	l := int(buf[1])
	hdr := 2
	if l&0x80 != 0 {
		k := l & 0x7f
		if k == 0 || k > 3 {
			return 0, fmt.Errorf("rdcleanpath: PDU length in %d bytes", k)
		}
		if len(buf) < 2+k {
			return 0, ErrShort
		}
		l = 0
		for _, c := range buf[2 : 2+k] {
			l = l<<8 | int(c)
		}
		if l < 0x80 || l>>(8*(k-1)) == 0 {
			return 0, errors.New("rdcleanpath: PDU length not in its shortest form")
		}
		hdr += k
	}
	if n := hdr + l; n > max {
		return 0, fmt.Errorf("rdcleanpath: PDU of %d bytes, over the limit of %d", n, max)
	}
	return hdr + l, nil
}

// Decode parses one whole PDU; trailing bytes are an error.
func Decode(b []byte) (*PDU, error) {
	p := &PDU{}
	in := cryptobyte.String(b)
	var seq cryptobyte.String
	if !in.ReadASN1(&seq, asn1.SEQUENCE) || !in.Empty() {
		return nil, errors.New("rdcleanpath: not one DER SEQUENCE")
	}
	var f cryptobyte.String
	if !seq.ReadASN1(&f, ctx(0)) || !f.ReadASN1Integer(&p.Version) || !f.Empty() {
		return nil, errors.New("rdcleanpath: [0] version missing or malformed")
	}
	last := 0
	for !seq.Empty() {
		var tag asn1.Tag
		if !seq.ReadAnyASN1(&f, &tag) {
			return nil, errors.New("rdcleanpath: malformed field")
		}
		n := int(tag &^ (0x80 | 0x20))
		if tag&0xe0 != 0xa0 || n <= last || n > 30 {
			return nil, fmt.Errorf("rdcleanpath: field tag 0x%02x out of place", uint8(tag))
		}
		last = n
		var err error
		switch n {
		case 1:
			p.Error, err = decodeError(f)
		case 2:
			p.Destination, err = readString(f, "destination")
		case 3:
			p.ProxyAuth, err = readString(f, "proxy_auth")
		case 4:
			p.ServerAuth, err = readString(f, "server_auth")
		case 5:
			p.PreconnectionBlob, err = readString(f, "preconnection_blob")
		case 6:
			var o cryptobyte.String
			if !f.ReadASN1(&o, asn1.OCTET_STRING) || !f.Empty() {
				return nil, errors.New("rdcleanpath: [6] x224_connection_pdu malformed")
			}
			p.X224 = append([]byte{}, o...)
		case 7:
			var s cryptobyte.String
			if !f.ReadASN1(&s, asn1.SEQUENCE) || !f.Empty() {
				return nil, errors.New("rdcleanpath: [7] server_cert_chain malformed")
			}
			p.ServerCertChain = [][]byte{}
			for !s.Empty() {
				var o cryptobyte.String
				if !s.ReadASN1(&o, asn1.OCTET_STRING) {
					return nil, errors.New("rdcleanpath: [7] server_cert_chain entry malformed")
				}
				p.ServerCertChain = append(p.ServerCertChain, append([]byte{}, o...))
			}
		case 9:
			p.ServerAddr, err = readString(f, "server_addr")
		default:
			// A field a later version adds ([8] is reserved for OCSP) is
			// skipped, as the reference decoder does not know it either.
		}
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

func readString(f cryptobyte.String, name string) (string, error) {
	var s cryptobyte.String
	if !f.ReadASN1(&s, asn1.UTF8String) || !f.Empty() || !utf8.Valid(s) {
		return "", fmt.Errorf("rdcleanpath: %s is not one UTF8String", name)
	}
	return string(s), nil
}

func decodeError(f cryptobyte.String) (*Error, error) {
	var s cryptobyte.String
	if !f.ReadASN1(&s, asn1.SEQUENCE) || !f.Empty() {
		return nil, errors.New("rdcleanpath: [1] error malformed")
	}
	e := &Error{}
	var v cryptobyte.String
	var code uint64
	if !s.ReadASN1(&v, ctx(0)) || !v.ReadASN1Integer(&code) || !v.Empty() || code > 0xffff {
		return nil, errors.New("rdcleanpath: error code missing or malformed")
	}
	e.Code = uint16(code)
	for i, max := range []uint64{0xffff, 0xffff, 0xff} {
		var present bool
		var x uint64
		if !s.ReadOptionalASN1(&v, &present, ctx(i+1)) {
			return nil, errors.New("rdcleanpath: error field malformed")
		}
		if !present {
			continue
		}
		if !v.ReadASN1Integer(&x) || !v.Empty() || x > max {
			return nil, fmt.Errorf("rdcleanpath: error field [%d] malformed", i+1)
		}
		switch i {
		case 0:
			h := uint16(x)
			e.HTTPStatus = &h
		case 1:
			w := uint16(x)
			e.WSAError = &w
		case 2:
			t := uint8(x)
			e.TLSAlert = &t
		}
	}
	if !s.Empty() {
		return nil, errors.New("rdcleanpath: error has trailing fields")
	}
	return e, nil
}
