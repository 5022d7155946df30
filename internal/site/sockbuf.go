package site

import (
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// underlayBuffer is the receive buffer each raw GRE socket asks for, as
// wireguard-go asks for its UDP sockets. A raw socket gets every
// datagram of a burst one by one (no offloads for protocol 47): with
// the kernel's default (net.core.rmem_default, 208 KiB), a 64 KiB TCP
// superpacket split into 1400-byte GRE datagrams, a few of them in
// flight, overflowed it whenever the receiving loop was not scheduled
// at once; a quarter of the TCP segments were then lost and sent again.
// The send buffer keeps the kernel's default: it bounds what waits in
// the underlay device's queue, so a full queue stops the sending loop
// instead of dropping what it sends (with 7 MiB the office's end
// overran its interface's queue and a fifth of its datagrams were
// dropped).
const underlayBuffer = 7 << 20

// growBuffers sets c's receive buffer to underlayBuffer: with
// CAP_NET_ADMIN past net.core.rmem_max (SO_RCVBUFFORCE), else as far as
// it allows.
func growBuffers(c net.PacketConn) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("socket buffers: %w", err)
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, underlayBuffer) != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, underlayBuffer)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("socket buffers: %w", err)
	}
	return nil
}
