package gateway

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/evloop"
)

// errWouldBlock is what a loopConn returns from Read when the bytes the
// event loop pushed are used up. It is temporary, so crypto/tls keeps its
// state and the read is retried once more bytes are pushed.
var errWouldBlock error = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "gateway: no more bytes until the socket is readable" }
func (wouldBlock) Timeout() bool   { return false }
func (wouldBlock) Temporary() bool { return true }

// loopConn sits under a client's TLS session. Until detach it passes
// everything to the accepted TCP connection. After, the socket belongs to
// an event loop: Read hands out only the bytes the loop pushed, and Write
// writes without blocking and keeps what the socket would not take, for
// the loop to send when it can. Close asks the loop to close the socket.
type loopConn struct {
	net.Conn

	// Loop goroutine only, after detach.
	pushing bool
	pending []byte
	owned   []byte // backing store when pending had to outlive the loop's buffer

	mu     sync.Mutex   // guards the fields below, after detach
	fd     int          // -1 once closed
	out    []byte       // written by TLS, not yet taken by the socket
	outLen atomic.Int64 // len(out), for the loop's checks without the lock
	// stallSince is the unix nanos since which out has waited with no byte
	// taken by the socket, 0 while it is empty; the watchdog reads it.
	stallSince atomic.Int64
	onClose    func() // asks the loop to close; set by detach
	closing    bool
	corked     bool   // writes collect in held until uncork sends them at once
	held       []byte // the loop's buffer while corked
	// deferred is set while the loop holds bytes of uncork's for the
	// socket, to send with its other sockets' at the round's end (see
	// relayLoop.queueSend): until sent says how much the socket took,
	// every write queues behind them. Written on the loop goroutine only.
	deferred bool
}

// loopListener wraps every accepted connection in a loopConn.
type loopListener struct{ net.Listener }

// Accept implements net.Listener.
func (l loopListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &loopConn{Conn: c, fd: -1}, nil
}

// detach hands the socket fd (a duplicate of the TCP connection's) to the
// loop; onClose is how Close reaches the loop. It refuses a connection
// that was closed already.
func (c *loopConn) detach(fd int, onClose func()) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return net.ErrClosed
	}
	c.fd, c.onClose, c.pushing = fd, onClose, true
	return nil
}

// push makes p the bytes Read hands out next. p is not copied; keep
// copies what is left when the loop's buffer is about to be reused.
func (c *loopConn) push(p []byte) { c.pending = p }

// keep copies unread pushed bytes out of the loop's shared buffer.
func (c *loopConn) keep() {
	if len(c.pending) == 0 {
		return
	}
	c.owned = append(c.owned[:0], c.pending...)
	c.pending = c.owned
}

// Read implements net.Conn.
func (c *loopConn) Read(p []byte) (int, error) {
	if !c.pushing {
		return c.Conn.Read(p)
	}
	if len(c.pending) == 0 {
		return 0, errWouldBlock
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// Write implements net.Conn. After detach it never blocks: what the
// socket does not take now is queued, and the loop stops reading the host
// until the queue has drained.
func (c *loopConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.pushing {
		c.mu.Unlock()
		return c.Conn.Write(p)
	}
	defer c.mu.Unlock()
	if c.fd < 0 {
		return 0, net.ErrClosed
	}
	if len(c.out) > 0 || c.deferred {
		c.out = append(c.out, p...)
		c.outLen.Store(int64(len(c.out)))
		return len(p), nil
	}
	if c.corked {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	if n, err := c.send(p); err != nil {
		return n, err
	}
	return len(p), nil
}

// send writes p to the socket and queues what it does not take; the
// caller holds mu and has checked that nothing is queued before p.
func (c *loopConn) send(p []byte) (int, error) {
	n, err := evloop.Write(c.fd, p)
	if err != nil {
		return n, &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	if n < len(p) {
		c.out = append(c.out, p[n:]...)
		c.outLen.Store(int64(len(c.out)))
		c.stallSince.Store(time.Now().UnixNano())
	}
	return n, nil
}

// cork makes writes collect in buf (the loop's, so an idle tunnel keeps
// none) until uncork, so the TLS records of one chunk from the host, up
// to four of 16 KiB, leave in one system call.
func (c *loopConn) cork(buf []byte) {
	c.mu.Lock()
	c.corked, c.held = true, buf[:0]
	c.mu.Unlock()
}

// uncork sends what cork collected, queueing what the socket refuses, and
// returns the buffer (grown, if it had to) for the loop to keep. Up to
// deferMax bytes, with nothing queued before them, are not sent but left
// to the caller (later), who hands a copy to the loop's sends of the
// round and reports the outcome to sent.
func (c *loopConn) uncork(deferMax int) (held []byte, later bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	held = c.held
	c.corked, c.held = false, nil
	if len(held) == 0 || c.fd < 0 {
		return held, false, nil
	}
	if len(held) <= deferMax && len(c.out) == 0 && !c.deferred {
		c.deferred = true
		return held, true, nil
	}
	_, err = c.send(held)
	return held, false, err
}

// sent is told how much of p, the bytes uncork left for later, the socket
// took (n, or err): it queues the rest in front of what was written
// meanwhile, and sends that when p went whole.
func (c *loopConn) sent(p []byte, n int, err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deferred = false
	if c.fd < 0 {
		return nil
	}
	if err != nil {
		return &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	if n < len(p) {
		c.out = append(append(make([]byte, 0, len(p)-n+len(c.out)), p[n:]...), c.out...)
		c.outLen.Store(int64(len(c.out)))
		c.stallSince.Store(time.Now().UnixNano())
		return nil
	}
	_, err = c.flushLocked()
	return err
}

// flush sends queued bytes; it reports whether the queue is empty.
func (c *loopConn) flush() (bool, error) {
	if c.outLen.Load() == 0 {
		return true, nil // every readiness edge reports writable too
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flushLocked()
}

// flushLocked is flush with mu held.
func (c *loopConn) flushLocked() (bool, error) {
	if len(c.out) == 0 || c.fd < 0 {
		return true, nil
	}
	if c.deferred {
		return false, nil // sent sends the queue after the loop's bytes
	}
	n, err := evloop.Write(c.fd, c.out)
	if err != nil {
		return false, err
	}
	c.out = c.out[:copy(c.out, c.out[n:])]
	if len(c.out) == 0 && cap(c.out) > 64<<10 {
		c.out = nil // a bulk burst is over; do not keep its buffer
	}
	c.outLen.Store(int64(len(c.out)))
	switch {
	case len(c.out) == 0:
		c.stallSince.Store(0)
	case n > 0:
		c.stallSince.Store(time.Now().UnixNano())
	}
	return len(c.out) == 0, nil
}

// clientQueueMax is how much may wait for a client before the loop stops
// reading from it too: its own pings and closes are answered into this
// queue, so a client that sends without reading must be held back.
const clientQueueMax = 256 << 10

// full reports whether the queue has reached clientQueueMax.
func (c *loopConn) full() bool { return c.outLen.Load() >= clientQueueMax }

// queued reports whether bytes wait for the socket; loop goroutine only.
func (c *loopConn) queued() bool { return c.deferred || c.outLen.Load() > 0 }

// closeFD closes the socket on the loop's goroutine, after one last try to
// send what is queued.
func (c *loopConn) closeFD() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return
	}
	if len(c.out) > 0 {
		_, _ = evloop.Write(c.fd, c.out)
		c.out = nil
		c.outLen.Store(0)
	}
	unix.Close(c.fd)
	c.fd = -1
}

// Close implements net.Conn.
func (c *loopConn) Close() error {
	c.mu.Lock()
	if !c.pushing {
		c.closing = true
		c.mu.Unlock()
		return c.Conn.Close()
	}
	if c.closing {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	f := c.onClose
	c.mu.Unlock()
	f()
	return nil
}

// Deadlines belong to the loop after detach (the tunnel's watchdog does
// the timing), so they are accepted and ignored.

// SetDeadline implements net.Conn.
func (c *loopConn) SetDeadline(t time.Time) error {
	if c.isPushing() {
		return nil
	}
	return c.Conn.SetDeadline(t)
}

// SetReadDeadline implements net.Conn.
func (c *loopConn) SetReadDeadline(t time.Time) error {
	if c.isPushing() {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline implements net.Conn.
func (c *loopConn) SetWriteDeadline(t time.Time) error {
	if c.isPushing() {
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *loopConn) isPushing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pushing
}
