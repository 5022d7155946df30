package stream

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// deadPeerTimeout is how long a connection's sent bytes may go
// unacknowledged (or its keepalive probes unanswered) before the kernel
// drops it. The documentation promises 25 s: a vanished client's
// connection can outlive the timeout by a couple of seconds while the
// kernel gives up resolving its address (a 25 s timeout released the
// image after up to 27.4 s in e2e/TestStreamVanishedClientReleasesItsImages,
// this one after 20.4 s).
const deadPeerTimeout = 20 * time.Second

// deadPeerChecks makes the kernel drop c soon after its client
// vanished, so that the same machine booting again is not
// refused its private image (or a maintenance version kept from
// promotion) as open by its own dead connection. Keepalive finds an idle
// client gone (the first probe to a rebooted machine draws a reset), but
// it never fires while a reply is unacknowledged, which is where a
// machine powered off mid-read leaves its connection: only
// TCP_USER_TIMEOUT bounds that, at 15 minutes of retransmissions
// otherwise. It also drops a client whose receive window stays shut
// that long.
func deadPeerChecks(c *net.TCPConn) {
	_ = c.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3})
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(deadPeerTimeout/time.Millisecond))
		})
	}
}
