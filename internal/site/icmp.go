package site

import (
	"encoding/binary"
	"net/netip"
)

// A packet bigger than the tunnel's MTU reaches the device only when
// the device's MTU was raised past the tunnel's (the namespace's kernel
// answers the others itself). IPv4 without DF goes on, its outer
// datagram fragmented by the kernel; IPv4 with DF and IPv6 are answered
// as a router would: ICMP fragmentation needed, or ICMPv6 packet too
// big, with the tunnel's MTU, written back into the device. The answer
// comes from the address the packet was for: the sender checks the
// quoted packet against its own sockets, and the tenant's namespace may
// have no address deskway knows.

// fragmentable tells an IPv4 packet without DF.
func (t *tenant) fragmentable(pkt []byte) bool {
	return pkt[0]>>4 == 4 && pkt[6]&0x40 == 0
}

// tooBig counts the drop and answers the sender.
func (t *tenant) tooBig(pkt []byte) {
	t.m.drop(dropTooBig)
	var b []byte
	if pkt[0]>>4 == 4 {
		b = fragNeeded(pkt, t.c().mtu)
	} else {
		b = packetTooBig(pkt, t.c().mtu)
	}
	if b == nil {
		return
	}
	if _, err := t.dev.Write([][]byte{b}, headroom); err != nil {
		t.m.drop(dropDeviceError)
	}
}

// fragNeeded is ICMP type 3 code 4 for the IPv4 packet pkt, with
// headroom before it; nil for a packet that gets no ICMP error (one
// that is itself an ICMP error, or a fragment past the first).
func fragNeeded(pkt []byte, mtu int) []byte {
	ihl := int(pkt[0]&0x0f) * 4
	if ihl < 20 || ihl > len(pkt) || binary.BigEndian.Uint16(pkt[6:])&0x1fff != 0 || isICMPError(pkt[9], pkt[ihl:], false) {
		return nil
	}
	quote := pkt[:min(len(pkt), 576-28)]
	b := make([]byte, headroom+28+len(quote))
	ip, icmp := b[headroom:headroom+20], b[headroom+20:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(28+len(quote)))
	ip[8], ip[9] = 64, 1
	copy(ip[12:16], pkt[16:20]) // from the address the packet was for
	copy(ip[16:20], pkt[12:16]) // to its sender
	binary.BigEndian.PutUint16(ip[10:], ^sum(ip, 0))
	icmp[0], icmp[1] = 3, 4
	binary.BigEndian.PutUint16(icmp[6:], uint16(mtu))
	copy(icmp[8:], quote)
	binary.BigEndian.PutUint16(icmp[2:], ^sum(icmp, 0))
	return b
}

// packetTooBig is ICMPv6 type 2 for the IPv6 packet pkt, with headroom
// before it; nil for an ICMPv6 error or a packet from no unicast address.
func packetTooBig(pkt []byte, mtu int) []byte {
	src, dst := innerSource(pkt), innerDest(pkt)
	if !src.IsGlobalUnicast() && !src.IsLinkLocalUnicast() || isICMPError(pkt[6], pkt[40:], true) {
		return nil
	}
	quote := pkt[:min(len(pkt), 1280-48)]
	b := make([]byte, headroom+48+len(quote))
	ip, icmp := b[headroom:headroom+40], b[headroom+40:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(8+len(quote)))
	ip[6], ip[7] = 58, 64
	copy(ip[8:24], pkt[24:40])
	copy(ip[24:40], pkt[8:24])
	icmp[0] = 2
	binary.BigEndian.PutUint32(icmp[4:], uint32(mtu))
	copy(icmp[8:], quote)
	binary.BigEndian.PutUint16(icmp[2:], ^sum(icmp, pseudo6(dst, src, len(icmp))))
	return b
}

// isICMPError tells an ICMP (or ICMPv6) error message, which must not be
// answered with another.
func isICMPError(proto byte, l4 []byte, v6 bool) bool {
	if v6 {
		return proto == 58 && len(l4) > 0 && l4[0] < 128
	}
	return proto == 1 && len(l4) > 0 && l4[0] != 0 && l4[0] != 8
}

// pseudo6 is the sum of ICMPv6's pseudo-header.
func pseudo6(src, dst netip.Addr, n int) uint32 {
	s, d := src.As16(), dst.As16()
	var h [40]byte
	copy(h[0:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint32(h[32:], uint32(n))
	h[39] = 58
	return sum32(h[:], 0)
}

// sum is the folded ones' complement sum of b (RFC 1071), from init.
func sum(b []byte, init uint32) uint16 {
	s := sum32(b, init)
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

func sum32(b []byte, s uint32) uint32 {
	for len(b) >= 2 {
		s += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}
