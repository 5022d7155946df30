package site

import (
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// An underlay whose interface coalesces received packets (GRO, which
// NICs do by default and the kernel's gre_offload does for GRE) hands
// the raw socket one datagram in place of many: outer IP, GRE, and an
// inner TCP packet of up to 64 KiB whose segments came one by one. Such
// an inner packet is bigger than the tunnel's MTU; written to the TUN
// device as it is, the tenant's namespace would have to send it on as
// one packet and could not. It is written instead with a virtio-net
// header asking the kernel to segment it (GSO) wherever it leaves the
// namespace: the path through the tenant's namespace and on to the
// desktop then carries one packet, not forty, which is where the
// datapath's time went (docs/site.md, How fast).

// virtioHdrLen is the size of struct virtio_net_hdr, which precedes
// every packet written to a TUN device with IFF_VNET_HDR.
const virtioHdrLen = 10

// fileDevice is the TUN device's file: wireguard-go's NativeTun gives
// it, and a superpacket is written to it straight, with a header
// wireguard-go's Write does not offer to set.
type fileDevice interface{ File() *os.File }

// superTCP tells whether the inner packet p, checked by innerPacket, is
// a TCP packet bigger than mtu that the device can take as one GSO
// packet; it returns the IP header's length.
func (t *tenant) superTCP(p []byte, mtu int) (iphLen int, ok bool) {
	if len(p) <= mtu || t.gsoConn == nil {
		return 0, false
	}
	switch p[0] >> 4 {
	case 4:
		iphLen = int(p[0]&0x0f) * 4
		// A fragment cannot be segmented.
		if iphLen < 20 || p[9] != unix.IPPROTO_TCP || binary.BigEndian.Uint16(p[6:])&0x3fff != 0 {
			return 0, false
		}
	case 6:
		// Extension headers are left to the one-by-one path.
		iphLen = 40
		if p[6] != unix.IPPROTO_TCP {
			return 0, false
		}
	default:
		return 0, false
	}
	if len(p) < iphLen+20 {
		return 0, false
	}
	thl := int(p[iphLen+12]>>4) * 4
	if thl < 20 || len(p) <= iphLen+thl || mtu-iphLen-thl < 8 {
		return 0, false
	}
	return iphLen, true
}

// writeSuper writes the superpacket b[virtioHdrLen:] (its inner IP
// packet, checked by superTCP) to the device as one GSO packet whose
// segments carry at most mtu bytes; b's first virtioHdrLen bytes are
// the header's room. It returns how many packets the kernel makes of it,
// which the counters count.
func (t *tenant) writeSuper(b []byte, iphLen, mtu int) (uint64, error) {
	p := b[virtioHdrLen:]
	thl := int(p[iphLen+12]>>4) * 4
	seg := mtu - iphLen - thl
	segs := uint64((len(p) - iphLen - thl + seg - 1) / seg)
	h := b[:virtioHdrLen]
	h[0] = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
	h[1] = unix.VIRTIO_NET_HDR_GSO_TCPV4
	if p[0]>>4 == 6 {
		h[1] = unix.VIRTIO_NET_HDR_GSO_TCPV6
	}
	// virtio-net's header is in the host's byte order: little endian
	// on every machine deskway runs on.
	binary.LittleEndian.PutUint16(h[2:], uint16(iphLen+thl))
	binary.LittleEndian.PutUint16(h[4:], uint16(seg))
	binary.LittleEndian.PutUint16(h[6:], uint16(iphLen))
	binary.LittleEndian.PutUint16(h[8:], 16) // TCP's checksum field
	// The TCP checksum field holds the pseudo-header's sum, which the
	// kernel completes for each segment (CHECKSUM_PARTIAL).
	tcpLen := len(p) - iphLen
	var ps uint32
	if p[0]>>4 == 4 {
		ps = sum32(p[12:20], uint32(unix.IPPROTO_TCP)+uint32(tcpLen))
	} else {
		ps = sum32(p[8:40], uint32(unix.IPPROTO_TCP)+uint32(tcpLen))
	}
	binary.BigEndian.PutUint16(p[iphLen+16:], sum(nil, ps))
	if _, err := rawWrite(t.gsoConn, b); err != nil {
		return segs, fmt.Errorf("write a %d-byte TCP superpacket to %s: %w", len(p), t.ifName, err)
	}
	return segs, nil
}
