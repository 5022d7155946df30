// Package proxyv2 decodes the binary header of the PROXY protocol,
// version 2 (HAProxy's proxy-protocol.txt, section 2.2), which a load
// balancer that passes TCP through sends first on each connection to say
// whose connection it is. The package does no I/O: a reader takes the
// fixed 16 bytes, asks Len how many follow, and reads exactly those, so
// not one byte of the client's own stream is read ahead.
package proxyv2

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Signature starts every version 2 header.
var Signature = []byte{0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A}

// FixedLen is the signature, the version and command, the family and
// protocol, and the length of what follows.
const FixedLen = 16

// MaxLen bounds what may follow the fixed part: addresses (at most 216
// bytes, for Unix sockets) and TLVs. Balancers send far less.
const MaxLen = 1024

// Header is what a PROXY header says of the connection.
type Header struct {
	// Local is a connection the balancer made itself (a health check):
	// the addresses are the connection's own.
	Local bool
	// Source and Dest are the client's address and the one it reached,
	// for TCP over IPv4 or IPv6; invalid for other families.
	Source, Dest netip.AddrPort
}

// Len checks the fixed part of a header and returns how many bytes
// follow it.
func Len(fixed []byte) (int, error) {
	if len(fixed) < FixedLen {
		return 0, fmt.Errorf("proxyv2: %d bytes, the fixed part is %d", len(fixed), FixedLen)
	}
	if !bytes.Equal(fixed[:12], Signature) {
		return 0, errors.New("proxyv2: no PROXY protocol version 2 signature")
	}
	if fixed[12]>>4 != 2 {
		return 0, fmt.Errorf("proxyv2: version %d", fixed[12]>>4)
	}
	if cmd := fixed[12] & 0xf; cmd > 1 {
		return 0, fmt.Errorf("proxyv2: command %d", cmd)
	}
	n := int(binary.BigEndian.Uint16(fixed[14:]))
	if n > MaxLen {
		return 0, fmt.Errorf("proxyv2: %d bytes after the fixed part, more than %d", n, MaxLen)
	}
	return n, nil
}

// Parse decodes a whole header: the fixed part and the Len bytes after.
func Parse(hdr []byte) (Header, error) {
	n, err := Len(hdr)
	if err != nil {
		return Header{}, err
	}
	if len(hdr) != FixedLen+n {
		return Header{}, fmt.Errorf("proxyv2: header of %d bytes, its length says %d", len(hdr), FixedLen+n)
	}
	h := Header{Local: hdr[12]&0xf == 0}
	body := hdr[FixedLen:]
	switch hdr[13] {
	case 0x11: // TCP over IPv4
		if len(body) < 12 {
			return Header{}, fmt.Errorf("proxyv2: IPv4 addresses in %d bytes", len(body))
		}
		h.Source = netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[0:4])), binary.BigEndian.Uint16(body[8:]))
		h.Dest = netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[4:8])), binary.BigEndian.Uint16(body[10:]))
	case 0x21: // TCP over IPv6
		if len(body) < 36 {
			return Header{}, fmt.Errorf("proxyv2: IPv6 addresses in %d bytes", len(body))
		}
		h.Source = netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[0:16])).Unmap(), binary.BigEndian.Uint16(body[32:]))
		h.Dest = netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[16:32])).Unmap(), binary.BigEndian.Uint16(body[34:]))
	default:
		if !h.Local {
			return Header{}, fmt.Errorf("proxyv2: family and protocol 0x%02x is not TCP over IPv4 or IPv6", hdr[13])
		}
	}
	return h, nil
}
