// Package proxylisten takes the PROXY protocol version 2 header off
// connections from trusted TCP load balancers, for servers (the gateway,
// the broker) that count, throttle and log by client address.
package proxylisten

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/proto/proxyv2"
)

// listener takes the PROXY protocol version 2 header off every
// connection from a trusted load balancer before anything else reads
// it, so that the server's caps, throttles and logs see the client's
// address and not the balancer's. A connection from a
// trusted address without a valid header is closed: behind a balancer
// that sends none, every client would share one address. Connections
// from anywhere else are passed on as they are; a header they send is
// only bytes that fail the TLS handshake.
//
// With bareTLS, a connection from a trusted address that starts with a
// TLS handshake record instead of a header is passed on too, marked
// (IsBare): a gateway farm's node-to-node link, which comes from the
// balancer's address when a node shares its host (or its NAT) with the
// balancer. A balancer that sends headers puts one before every client
// byte, so no client reaches the server bare through it; the server
// serves nothing but links that prove themselves on such a connection.
//
// Headers are read on a goroutine per connection, so a balancer
// connection that is slow to send one holds up no one else's accept,
// and read exactly, so the connection's socket can still be handed to an
// event loop with nothing read ahead.
type listener struct {
	net.Listener
	trusted []netip.Prefix
	timeout time.Duration
	log     *slog.Logger
	bareTLS bool

	conns     chan net.Conn
	errc      chan error
	done      chan struct{}
	closeOnce sync.Once
}

// New wraps ln: connections from addresses in trusted must start with a
// PROXY v2 header, read within timeout, whose source becomes their
// RemoteAddr; others pass as they are. Refusals are logged on log.
func New(ln net.Listener, trusted []netip.Prefix, timeout time.Duration, log *slog.Logger) net.Listener {
	return newListener(ln, trusted, timeout, log, false)
}

// NewAllowingBareTLS is New, except that a connection from a trusted
// address that starts with a TLS handshake instead of a header is passed
// on as it is, marked: IsBare reports it, and the server must serve on
// it only what authenticates itself (a gateway farm's peer links).
func NewAllowingBareTLS(ln net.Listener, trusted []netip.Prefix, timeout time.Duration, log *slog.Logger) net.Listener {
	return newListener(ln, trusted, timeout, log, true)
}

func newListener(ln net.Listener, trusted []netip.Prefix, timeout time.Duration, log *slog.Logger, bareTLS bool) net.Listener {
	l := &listener{Listener: ln, trusted: trusted, timeout: timeout, log: log, bareTLS: bareTLS,
		conns: make(chan net.Conn), errc: make(chan error, 1), done: make(chan struct{})}
	go l.acceptLoop()
	return l
}

// IsBare reports whether c came from a trusted balancer's address with no
// PROXY header, starting with a TLS handshake (NewAllowingBareTLS).
func IsBare(c net.Conn) bool {
	_, ok := c.(*bareConn)
	return ok
}

func (l *listener) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				select {
				case l.errc <- err:
				case <-l.done:
				}
				return
			}
			// Out of file descriptors and the like: the listener is still
			// good, so wait a little and accept again, as net/http does,
			// rather than stop serving for good.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.log.Warn("accept failed; trying again", "err", err, "in", backoff.String())
			select {
			case <-time.After(backoff):
				continue
			case <-l.done:
				return
			}
		}
		backoff = 0
		if !l.isTrusted(c.RemoteAddr()) {
			l.hand(c)
			continue
		}
		go func() {
			pc, err := l.readHeader(c)
			if err != nil {
				l.log.Warn("connection from a trusted load balancer closed: no valid PROXY protocol v2 header (HAProxy: send-proxy-v2, and check-send-proxy for health checks)",
					"balancer", c.RemoteAddr().String(), "err", err)
				_ = c.Close()
				return
			}
			l.hand(pc)
		}()
	}
}

// hand gives c to Accept, or closes it once the listener is closed.
func (l *listener) hand(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		_ = c.Close()
	}
}

func (l *listener) isTrusted(a net.Addr) bool {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return false
	}
	for _, p := range l.trusted {
		if p.Contains(ap.Addr().Unmap()) {
			return true
		}
	}
	return false
}

func (l *listener) readHeader(c net.Conn) (net.Conn, error) {
	_ = c.SetReadDeadline(time.Now().Add(l.timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	if l.bareTLS {
		first, err := peekByte(c)
		if err != nil {
			return nil, fmt.Errorf("reading the first byte: %w", err)
		}
		// A header starts with CR; a TLS connection with a handshake
		// record (type 22).
		if first == tlsHandshake {
			return &bareConn{Conn: c}, nil
		}
	}
	hdr := make([]byte, proxyv2.FixedLen, proxyv2.FixedLen+64)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	n, err := proxyv2.Len(hdr)
	if err != nil {
		return nil, err
	}
	hdr = append(hdr, make([]byte, n)...)
	if _, err := io.ReadFull(c, hdr[proxyv2.FixedLen:]); err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	h, err := proxyv2.Parse(hdr)
	if err != nil {
		return nil, err
	}
	if h.Local {
		return c, nil // the balancer's own connection: a health check
	}
	return &proxiedConn{Conn: c, remote: net.TCPAddrFromAddrPort(h.Source)}, nil
}

// Accept implements net.Listener.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errc:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// tlsHandshake is the content type of a TLS handshake record, the first
// byte a TLS client sends.
const tlsHandshake = 22

// peekByte waits for c's first byte and returns it, leaving it to be read:
// the socket may yet be handed to an event loop, which must find every
// byte of the stream in it.
func peekByte(c net.Conn) (byte, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, errors.New("the connection has no socket to peek at")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var b [1]byte
	var n int
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		for {
			n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK)
			if rerr != unix.EINTR {
				return rerr != unix.EAGAIN
			}
		}
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return b[0], nil
}

// bareConn is a connection from a trusted balancer's address that came
// without a PROXY header: its RemoteAddr is the balancer's, and only what
// proves itself may be served on it.
type bareConn struct{ net.Conn }

// proxiedConn is a connection whose client is the one its PROXY header
// named.
type proxiedConn struct {
	net.Conn
	remote net.Addr
}

// RemoteAddr is the client's address, from the PROXY header.
func (c *proxiedConn) RemoteAddr() net.Addr { return c.remote }

// SyscallConn exposes the socket beneath, for the relay's event loops.
func (c *proxiedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("proxylisten: proxied connection has no socket")
	}
	return sc.SyscallConn()
}
