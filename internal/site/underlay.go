package site

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/deskway/deskway/internal/proto/gre"
)

const (
	// headroom is kept free before each inner packet: the TUN device
	// writes its virtio-net header there, and GRE's header goes there on
	// the way out, after the outer IPv4 header when the
	// datagram leaves as a frame (frames.go).
	headroom = 64
	// batch is how many datagrams one recvmmsg or sendmmsg moves.
	batch = 64
	// maxDatagram is the largest IP datagram.
	maxDatagram = 65535
)

var errClosed = errors.New("closed")

// batchConn is ipv4's or ipv6's PacketConn: both batch with the same
// message type. It sends; the underlay receives with its own recvmmsg
// (rawsys.go).
type batchConn interface {
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// underlay is one raw GRE socket (IP protocol 47) on a local address.
// Its receive loop is the only reader; links of every tenant write.
type underlay struct {
	local netip.Addr
	conn  net.PacketConn
	bc    batchConn
	set   *atomic.Pointer[tenantSet]
	// frames sends as whole frames (frames.go); nil: the raw socket.
	frames *frameTx
	m      *metrics
	log    *slog.Logger
}

// listenUnderlay opens the raw GRE socket on local (bound with
// IP_FREEBIND when free: an HA gateway's address may be the other's);
// with frames, GRE to IPv4 sites also leaves as frames (frames.go).
func listenUnderlay(local netip.Addr, set *atomic.Pointer[tenantSet], m *metrics, log *slog.Logger, free, frames bool) (*underlay, error) {
	network := "ip4:47"
	if local.Is6() {
		network = "ip6:47"
	}
	var lc net.ListenConfig
	if free {
		lc.Control = freebind
	}
	c, err := lc.ListenPacket(context.Background(), network, local.String())
	if err != nil {
		return nil, fmt.Errorf("raw GRE socket on %s: %w", local, err)
	}
	if err := growBuffers(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("raw GRE socket on %s: %w", local, err)
	}
	u := &underlay{local: local, conn: c, set: set, m: m, log: log}
	if !local.Is4() {
		u.bc = ipv6.NewPacketConn(c)
		return u, nil
	}
	u.bc = ipv4.NewPacketConn(c)
	if frames {
		if u.frames, err = newFrameTx(local); err != nil {
			log.Warn("GRE is sent on the raw socket alone", "underlay", local, "error", err)
		}
	}
	return u, nil
}

func (u *underlay) close() {
	_ = u.conn.Close()
	if u.frames != nil {
		u.frames.close()
	}
}

// receive decapsulates until the socket is closed: each datagram is
// checked (GRE, key, peer, inner source) and the accepted ones are
// written to their tenants' devices, a batch per tenant.
func (u *underlay) receive() error {
	sc, ok := u.conn.(syscall.Conn)
	if !ok {
		return fmt.Errorf("site: receive on %s: the socket has no descriptor", u.local)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("site: receive on %s: %w", u.local, err)
	}
	b := newRecvBatch(batch)
	pending := map[*tenant][][]byte{}
	for {
		n, err := b.recv(rc)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return errClosed
			}
			return fmt.Errorf("site: receive on %s: %w", u.local, err)
		}
		now := time.Now().UnixNano()
		for i := range n {
			t, st, start, end := u.decap(b.datagram(i))
			if t == nil {
				continue
			}
			size, pkts := uint64(end-start), uint64(1)
			if iphLen, ok := t.superTCP(b.bufs[i][headroom+start:headroom+end], t.c().mtu); ok {
				// Packets before it in the batch go first: a flow's
				// order is kept.
				u.flush(t, pending)
				var err error
				if pkts, err = t.writeSuper(b.bufs[i][headroom+start-virtioHdrLen:headroom+end], iphLen, t.c().mtu); err != nil {
					t.m.drop(dropDeviceError)
					u.log.Debug("write to tunnel device", "tenant", t.name, "error", err)
				}
			} else {
				// The inner packet with its headroom, in bufs[i]'s terms.
				pending[t] = append(pending[t], b.bufs[i][start:headroom+end])
			}
			st.pktsIn.Add(pkts)
			st.bytesIn.Add(size)
			st.lastIn.Store(now)
			t.m.pktsIn.Add(float64(pkts))
			t.m.bytesIn.Add(float64(size))
		}
		for t := range pending {
			u.flush(t, pending)
		}
	}
}

// flush writes the packets pending for t to its device.
func (u *underlay) flush(t *tenant, pending map[*tenant][][]byte) {
	pkts := pending[t]
	if len(pkts) > 0 {
		if _, err := t.dev.Write(pkts, headroom); err != nil {
			t.m.drop(dropDeviceError)
			u.log.Debug("write to tunnel device", "tenant", t.name, "error", err)
		}
	}
	pending[t] = pkts[:0] // kept for the next batch: the tenants are few
	if t.closing.Load() {
		delete(pending, t) // removed by a reload
	}
}

// decap checks one datagram b from src. It returns the tenant and site
// it belongs to and where its inner packet lies in b, less headroom at
// the start; nil when it was dropped (and counted).
func (u *underlay) decap(b []byte, src netip.Addr) (t *tenant, st *peerSite, start, end int) {
	off := 0
	if u.local.Is4() {
		// A raw IPv4 socket hands the IP header over too.
		if len(b) < 20 || int(b[0]&0x0f)*4 < 20 || int(b[0]&0x0f)*4 > len(b) {
			u.m.unknown.drop(dropShort)
			return nil, nil, 0, 0
		}
		off = int(b[0]&0x0f) * 4
	}
	var p gre.Packet
	if err := p.Decode(b[off:]); err != nil {
		var de *gre.DecodeError
		if errors.As(err, &de) {
			u.m.unknown.drop(cause(de.Kind))
		}
		u.log.Debug("malformed GRE", "from", src, "error", err)
		return nil, nil, 0, 0
	}
	if !p.HasKey {
		u.m.unknown.drop(dropNoKey)
		return nil, nil, 0, 0
	}
	if t = u.set.Load().byKey[p.Key]; t == nil {
		u.m.unknown.drop(dropUnknownKey)
		return nil, nil, 0, 0
	}
	if st = t.c().byPeer[src]; st == nil {
		t.m.drop(dropNotPeer)
		return nil, nil, 0, 0
	}
	inner, ok := innerPacket(p.Protocol, p.Payload)
	if !ok {
		t.m.drop(dropBadInner)
		return nil, nil, 0, 0
	}
	if u.keepalive(t, st, inner) {
		return nil, nil, 0, 0
	}
	if !st.owns(innerSource(inner)) {
		t.m.drop(dropSpoofed)
		return nil, nil, 0, 0
	}
	start = len(b) - len(p.Payload)
	return t, st, start, start + len(inner)
}

// innerPacket checks that payload is an IP packet of the version proto
// names and returns it cut to its own length.
func innerPacket(proto uint16, payload []byte) ([]byte, bool) {
	switch proto {
	case gre.ProtoIPv4:
		if len(payload) < 20 || payload[0]>>4 != 4 {
			return nil, false
		}
		n := int(binary.BigEndian.Uint16(payload[2:]))
		if n < 20 || n > len(payload) {
			return nil, false
		}
		return payload[:n], true
	case gre.ProtoIPv6:
		if len(payload) < 40 || payload[0]>>4 != 6 {
			return nil, false
		}
		n := 40 + int(binary.BigEndian.Uint16(payload[4:]))
		if n > len(payload) {
			return nil, false
		}
		return payload[:n], true
	}
	return nil, false
}

// innerSource and innerDest read a checked packet's addresses.
func innerSource(p []byte) netip.Addr {
	if p[0]>>4 == 4 {
		return netip.AddrFrom4([4]byte(p[12:16]))
	}
	return netip.AddrFrom16([16]byte(p[8:24]))
}

func innerDest(p []byte) netip.Addr {
	if p[0]>>4 == 4 {
		return netip.AddrFrom4([4]byte(p[16:20]))
	}
	return netip.AddrFrom16([16]byte(p[24:40]))
}

// owns tells an address of the site's configured or learnt prefixes.
func (st *peerSite) owns(a netip.Addr) bool {
	for _, p := range st.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	for _, p := range *st.learnt.Load() {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
