package site

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The raw GRE socket costs the sending end most of its time in the
// kernel, per datagram: a route lookup, the IP output path, the
// neighbour and the queueing discipline (docs/site.md, How fast). An
// IPv4 underlay on Ethernet sends its GRE datagrams instead as whole
// frames on a packet socket (AF_PACKET) that skips all but the last: the
// gateway writes the outer IP header itself and addresses the frame to
// the next hop's hardware address (the kernel adds the Ethernet header,
// SOCK_DGRAM: a SOCK_RAW frame would go through the flow dissector),
// with the route and the next hop it reads from the kernel (netlink)
// every pathCheck and after the kernel's neighbours change. The raw
// socket stays for what the frames cannot do: a next hop not resolved
// yet, a datagram bigger than the interface's MTU (the kernel fragments
// it), an interface without Ethernet, an IPv6 underlay.

const (
	// pathCheck is how often a site's route and next hop are read
	// again when the kernel reports no neighbour change: a route
	// changes without one.
	pathCheck = 500 * time.Millisecond
	// minCheck is the least time between two readings, however often
	// the kernel's neighbours change (a busy LAN's come and go).
	minCheck = 50 * time.Millisecond
	// frameHead is the room the outer IPv4 header takes before the GRE
	// header; the kernel writes the Ethernet header.
	frameHead = 20
	// outerTTL is the outer header's time to live, Linux's default.
	outerTTL = 64
	// sendTimeout bounds how long one sendmmsg on the packet socket
	// waits for room in its send buffer.
	sendTimeout = 10 * time.Millisecond
)

// frameTx is an underlay's packet socket and the netlink handle its
// sites' paths are read with.
type frameTx struct {
	fd    int
	local [4]byte
	id    atomic.Uint32 // outer IPv4 identification
	// changes counts the kernel's neighbour changes: a site's path is
	// read again at the next batch after one, so a gateway that took
	// over the site's address (its gratuitous ARP) is followed at once.
	changes atomic.Uint64
	done    chan struct{}

	mu sync.Mutex // serializes what follows
	nl *netlink.Handle
	// neighs are the kernel's usable neighbour entries read at
	// neighRead, after neighChanges changes.
	neighs       map[neighKey]net.HardwareAddr
	neighRead    time.Time
	neighChanges uint64
}

type neighKey struct {
	ifindex int
	ip      netip.Addr
}

// newFrameTx opens the packet socket of an IPv4 underlay at local; nil
// (and the raw socket alone) when the node does not allow it.
func newFrameTx(local netip.Addr) (*frameTx, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	// A send made as a raw system call (rawsys.go) holds its
	// processor while it waits for room in the send buffer; it waits
	// sendTimeout at most, then the batch's rest is tried again.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Usec: sendTimeout.Microseconds()}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("packet socket: send timeout: %w", err)
	}
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink: %w", err)
	}
	f := &frameTx{fd: fd, local: local.As4(), nl: nl, neighs: map[neighKey]net.HardwareAddr{}, done: make(chan struct{})}
	ch := make(chan netlink.NeighUpdate, 64)
	if err := netlink.NeighSubscribeWithOptions(ch, f.done, netlink.NeighSubscribeOptions{}); err != nil {
		f.close()
		return nil, fmt.Errorf("neighbour changes: %w", err)
	}
	go func() {
		for range ch { // closed when done is
			f.changes.Add(1)
		}
	}()
	return f, nil
}

func (f *frameTx) close() {
	close(f.done)
	unix.Close(f.fd)
	f.nl.Close()
}

// l2path is how a site is reached on the link: the interface and the
// next hop's hardware address.
type l2path struct {
	ifindex int
	mtu     int
	hop     [6]byte
}

// usableNeigh are the neighbour states whose hardware address the kernel
// would send to itself.
const usableNeigh = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT

// path reads how peer is reached: nil when frames cannot reach it (a
// local or unreachable route, no Ethernet, the next hop unresolved).
func (f *frameTx) path(peer netip.Addr) (*l2path, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	routes, err := f.nl.RouteGet(peer.AsSlice())
	if err != nil {
		return nil, fmt.Errorf("route to %s: %w", peer, err)
	}
	if len(routes) == 0 || routes[0].Type != unix.RTN_UNICAST || routes[0].LinkIndex == 0 {
		return nil, nil
	}
	r := routes[0]
	hop := peer
	if gw, ok := netip.AddrFromSlice(r.Gw); ok && gw.Unmap().IsValid() && !gw.IsUnspecified() {
		hop = gw.Unmap()
	}
	link, err := f.nl.LinkByIndex(r.LinkIndex)
	if err != nil {
		return nil, fmt.Errorf("interface %d: %w", r.LinkIndex, err)
	}
	a := link.Attrs()
	if a.EncapType != "ether" || len(a.HardwareAddr) != 6 || a.Flags&net.FlagUp == 0 {
		return nil, nil
	}
	mac, err := f.neighbour(r.LinkIndex, hop, time.Now())
	if err != nil || mac == nil {
		return nil, err
	}
	p := &l2path{ifindex: r.LinkIndex, mtu: a.MTU}
	copy(p.hop[:], mac)
	return p, nil
}

// neighbour is the hardware address the kernel has for hop on the
// interface ifindex, nil if none it would use. One reading of the
// kernel's table serves every site for pathCheck/2: a gateway with many
// sites reads it once, not once a site.
func (f *frameTx) neighbour(ifindex int, hop netip.Addr, now time.Time) (net.HardwareAddr, error) {
	if since, c := now.Sub(f.neighRead), f.changes.Load(); since >= pathCheck/2 || (since >= minCheck && c != f.neighChanges) {
		f.neighChanges = c
		neighs, err := f.nl.NeighList(0, unix.AF_INET)
		if err != nil {
			return nil, fmt.Errorf("neighbours: %w", err)
		}
		clear(f.neighs)
		for _, n := range neighs {
			ip, ok := netip.AddrFromSlice(n.IP)
			if ok && n.State&usableNeigh != 0 && len(n.HardwareAddr) == 6 {
				f.neighs[neighKey{n.LinkIndex, ip.Unmap()}] = n.HardwareAddr
			}
		}
		f.neighRead = now
	}
	return f.neighs[neighKey{ifindex, hop}], nil
}

// frameSender is a greLink's state for frames: read by its tenant's
// encapsulating loop alone.
type frameSender struct {
	path    *l2path
	checked time.Time
	changes uint64 // the underlay's neighbour changes at checked
	msgs    []unix.Mmsghdr
	iovs    []unix.Iovec
	addr    unix.RawSockaddrLinklayer
}

// route tells whether the batch goes as frames, reading the site's path
// again every pathCheck and after a change of the kernel's neighbours
// (minCheck apart at least). The batch after each check goes through the
// raw socket: the kernel then uses its neighbour entry and confirms or
// resolves it again, which frames alone never make it do.
func (s *frameSender) route(f *frameTx, peer netip.Addr, now time.Time) (*l2path, error) {
	c := f.changes.Load()
	if since := now.Sub(s.checked); since < minCheck || (since < pathCheck && c == s.changes) {
		return s.path, nil
	}
	s.checked, s.changes = now, c
	p, err := f.path(peer)
	s.path = p
	return nil, err
}

// send sends frames to peer on p: each is frameHead bytes of room for
// the outer IPv4 header, then a GRE datagram. It returns false when a
// datagram is too big for the link and the batch should go through the
// raw socket instead, which fragments.
func (s *frameSender) send(f *frameTx, p *l2path, peer netip.Addr, frames [][]byte) (bool, error) {
	for _, fr := range frames {
		if len(fr) > p.mtu {
			return false, nil
		}
	}
	s.addr = unix.RawSockaddrLinklayer{Family: unix.AF_PACKET, Protocol: htons(unix.ETH_P_IP), Ifindex: int32(p.ifindex), Halen: 6}
	copy(s.addr.Addr[:], p.hop[:])
	s.msgs, s.iovs = s.msgs[:0], s.iovs[:0]
	dst := peer.As4()
	for _, fr := range frames {
		ip := fr[:frameHead]
		ip[0], ip[1] = 0x45, 0
		binary.BigEndian.PutUint16(ip[2:], uint16(len(fr)))
		binary.BigEndian.PutUint16(ip[4:], uint16(f.id.Add(1)))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // don't fragment, as the raw socket sends
		ip[8], ip[9] = outerTTL, unix.IPPROTO_GRE
		ip[10], ip[11] = 0, 0
		copy(ip[12:16], f.local[:])
		copy(ip[16:20], dst[:])
		binary.BigEndian.PutUint16(ip[10:], ^sum(ip, 0))
		s.iovs = append(s.iovs, unix.Iovec{Base: &fr[0], Len: uint64(len(fr))})
	}
	for i := range s.iovs {
		s.msgs = append(s.msgs, unix.Mmsghdr{Hdr: unix.Msghdr{Name: (*byte)(unsafe.Pointer(&s.addr)), Namelen: unix.SizeofSockaddrLinklayer, Iov: &s.iovs[i], Iovlen: 1}})
	}
	sent, full := 0, 0
	for sent < len(s.msgs) {
		// A raw system call (rawsys.go).
		n, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(f.fd), uintptr(unsafe.Pointer(&s.msgs[sent])), uintptr(len(s.msgs)-sent), 0, 0, 0)
		if errno == unix.ENOBUFS || errno == unix.EAGAIN {
			if full++; full == maxFullWaits {
				return true, &sendError{sent: sent, err: errno}
			}
			time.Sleep(fullWait)
			continue
		}
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return true, &sendError{sent: sent, err: errno}
		}
		sent += int(n)
	}
	return true, nil
}

// sendError is a batch that stopped after sent datagrams.
type sendError struct {
	sent int
	err  error
}

func (e *sendError) Error() string { return fmt.Sprintf("send frames: %v", e.err) }
func (e *sendError) Unwrap() error { return e.err }
