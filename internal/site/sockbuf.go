package site

import (
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// underlayBuffer is the receive and send buffer each raw GRE socket
// asks for, as wireguard-go asks for its UDP sockets. A raw socket gets
// every datagram of a burst one by one (no offloads for protocol 47):
// with the kernel's default (net.core.rmem_default, 208 KiB), a
// 64 KiB TCP superpacket split into 1400-byte GRE datagrams, a few of
// them in flight, overflowed it whenever the receiving loop was not
// scheduled at once; a quarter of the TCP segments were then lost and
// sent again.
const underlayBuffer = 7 << 20

// growBuffers sets c's buffers to underlayBuffer: with CAP_NET_ADMIN
// past net.core.rmem_max and wmem_max (SO_RCVBUFFORCE), else as far as
// they allow.
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
		for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], underlayBuffer) != nil {
				if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], underlayBuffer); e != nil {
					serr = e
				}
			}
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
