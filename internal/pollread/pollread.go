// Package pollread reads a TCP connection in a loop that waits for
// readiness after a short read instead of reading again.
//
// Go's net package reads first and parks on EAGAIN, so a connection that
// carries one small message at a time (an interactive tunnel) costs two
// read calls per message, one of them failing: on a relay serving
// thousands of such connections that is a third of its system calls. A
// read that returned less than its buffer drained the socket at that
// moment, and the edge-triggered poller raises a new edge for every
// later arrival, so the loop can wait for that edge and read once. The
// whole loop runs inside one syscall.RawConn.Read call because each new
// call forgets an edge that arrived before it.
package pollread

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// Pump reads c until EOF or an error and hands each chunk to fn, which
// returns the buffer for the next read (the same one, or a larger one
// for a bulk transfer) or an error that stops the loop and is returned.
// A connection without a file descriptor is read the ordinary way. EOF
// is returned as io.EOF; a closed connection as an error matching
// net.ErrClosed.
func Pump(c net.Conn, buf []byte, fn func(p []byte) ([]byte, error)) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return pumpPlain(c, buf, fn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return pumpPlain(c, buf, fn)
	}
	var stop error
	rerr := raw.Read(func(fd uintptr) bool {
		for {
			n, err := syscall.Read(int(fd), buf)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return false
			case err != nil:
				stop = &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", err)}
				return true
			case n == 0:
				stop = io.EOF
				return true
			}
			short := n < len(buf)
			if buf, stop = fn(buf[:n]); stop != nil {
				return true
			}
			if short {
				return false
			}
		}
	})
	if stop != nil {
		return stop
	}
	return rerr
}

func pumpPlain(c net.Conn, buf []byte, fn func(p []byte) ([]byte, error)) error {
	for {
		n, err := c.Read(buf)
		if n > 0 {
			var ferr error
			if buf, ferr = fn(buf[:n]); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.EOF
			}
			return err
		}
	}
}
