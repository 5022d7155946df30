package site

import (
	"fmt"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The datapath's busiest system calls (the frames' sendmmsg, the
// superpackets' write to a tenant's device, the underlay's recvmmsg)
// are made as raw system calls. Go's ordinary ones mark the thread as
// in a system call, and one that lasts longer than the runtime's
// monitor tick (20 µs; a batch of 45 frames, or a 64 KiB superpacket's
// write, which runs the tenant namespace's whole forwarding path) has
// its processor handed to another thread and taken back after, and the
// monitor, finding such work, keeps ticking every 20 µs: under the
// bench's load it took 9–10 % of the office end's CPU, 2–2.5 % with the
// raw calls (docs/site.md, How fast). A raw call holds its processor
// while the kernel runs it: the write and recvmmsg are on non-blocking
// descriptors, and the packet socket, which blocks while its send
// buffer is full, gives up after sendTimeout.

// rawWrite writes b to the descriptor behind rc in one write(2).
func rawWrite(rc syscall.RawConn, b []byte) (int, error) {
	var n uintptr
	var errno syscall.Errno
	err := rc.Write(func(fd uintptr) bool {
		n, _, errno = unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		return errno != unix.EAGAIN
	})
	if err != nil {
		return 0, fmt.Errorf("write: %w", err)
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// recvBatch is the underlay's receiving state: recvmmsg's headers, each
// reading into bufs[i][headroom:] and naming its sender in names[i].
type recvBatch struct {
	bufs  [][]byte
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // room for either family's address
}

func newRecvBatch(n int) *recvBatch {
	b := &recvBatch{bufs: make([][]byte, n), hdrs: make([]unix.Mmsghdr, n), iovs: make([]unix.Iovec, n), names: make([]unix.RawSockaddrInet6, n)}
	for i := range n {
		b.bufs[i] = make([]byte, headroom+maxDatagram)
		b.iovs[i] = unix.Iovec{Base: &b.bufs[i][headroom], Len: maxDatagram}
		b.hdrs[i].Hdr.Iov, b.hdrs[i].Hdr.Iovlen = &b.iovs[i], 1
		b.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
	}
	return b
}

// recv reads a batch of datagrams from the socket behind rc in one
// recvmmsg(2), waiting in the poller until one is there.
func (b *recvBatch) recv(rc syscall.RawConn) (int, error) {
	for i := range b.hdrs {
		b.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		b.hdrs[i].Hdr.Flags = 0
	}
	var n uintptr
	var errno syscall.Errno
	err := rc.Read(func(fd uintptr) bool {
		n, _, errno = unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(len(b.hdrs)), 0, 0, 0)
		return errno != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// datagram is the i-th datagram read and its sender.
func (b *recvBatch) datagram(i int) ([]byte, netip.Addr) {
	p := b.bufs[i][headroom : headroom+int(b.hdrs[i].Len)]
	switch b.names[i].Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&b.names[i]))
		return p, netip.AddrFrom4(sa.Addr)
	case unix.AF_INET6:
		return p, netip.AddrFrom16(b.names[i].Addr).Unmap()
	}
	return p, netip.Addr{}
}
