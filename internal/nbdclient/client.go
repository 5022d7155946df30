// Package nbdclient is a small NBD client: fixed newstyle negotiation
// with NBD_OPT_GO, simple or structured replies, optional TLS, and
// requests pipelined on one connection (each call waits only for its own
// reply). The stream role's tests and the boot-storm bench use it.
package nbdclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/proto/nbd"
)

// Options tune a connection.
type Options struct {
	// Structured asks for structured replies (as libnbd and qemu do);
	// without it the client uses simple replies like the Linux kernel.
	Structured bool
	// TLS, when set, upgrades the connection with NBD_OPT_STARTTLS.
	TLS *tls.Config
}

// Export is what the server announced for the export a handshake opened.
type Export struct {
	Size  uint64
	Flags nbd.TransmissionFlags
}

// Client is one NBD connection in the transmission phase.
type Client struct {
	conn net.Conn
	Export

	wmu    sync.Mutex
	mu     sync.Mutex
	next   uint64
	wait   map[uint64]*call
	err    error // set once the reader stops
	closed chan struct{}
}

// call is one request waiting for its reply.
type call struct {
	buf  []byte // READ destination
	off  uint64 // READ offset, to place structured chunks
	done chan error
}

// ServerError is an error the server returned for a request.
type ServerError struct {
	Errno   nbd.Errno
	Message string
}

// Error implements error.
func (e *ServerError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("nbd: server error %s: %s", e.Errno, e.Message)
	}
	return "nbd: server error " + e.Errno.String()
}

// OptionError is a refusal during negotiation.
type OptionError struct {
	Option  nbd.Option
	Type    nbd.ReplyType
	Message string
}

// Error implements error.
func (e *OptionError) Error() string {
	return fmt.Sprintf("nbd: %s refused (reply %#x): %s", e.Option, uint32(e.Type), e.Message)
}

// Dial connects to addr and opens export.
func Dial(ctx context.Context, addr, export string, o Options) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	tconn, ex, err := Handshake(conn, export, o)
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = tconn.SetDeadline(time.Time{})
	return New(tconn, ex), nil
}

// New runs the transmission phase of export ex on conn, a connection
// Handshake negotiated: for callers that negotiate themselves, as
// deskway-nbdroot's reconnect path does.
func New(conn net.Conn, ex Export) *Client {
	c := &Client{conn: conn, Export: ex, wait: map[uint64]*call{}, closed: make(chan struct{})}
	// Small enough that large READ payloads bypass it and are copied once.
	go c.readLoop(bufio.NewReaderSize(c.conn, 32<<10))
	return c
}

// Handshake negotiates export on conn and leaves the connection in the
// transmission phase, for callers that run that phase themselves (the
// boot-storm bench drives thousands from event loops). With Options.TLS
// the connection to go on with is the returned TLS one.
func Handshake(conn net.Conn, export string, o Options) (net.Conn, Export, error) {
	var ex Export
	r := bufio.NewReader(conn)
	g := make([]byte, nbd.GreetingLen)
	if _, err := io.ReadFull(r, g); err != nil {
		return nil, ex, fmt.Errorf("nbd: greeting: %w", err)
	}
	hf, err := nbd.ParseGreeting(g)
	if err != nil {
		return nil, ex, err
	}
	if hf&nbd.FlagFixedNewstyle == 0 {
		return nil, ex, errors.New("nbd: server does not speak fixed newstyle")
	}
	cf := nbd.FlagCFixedNewstyle
	if hf&nbd.FlagNoZeroes != 0 {
		cf |= nbd.FlagCNoZeroes
	}
	if _, err := conn.Write([]byte{0, 0, 0, byte(cf)}); err != nil {
		return nil, ex, err
	}
	if o.TLS != nil {
		if err := option(conn, r, nbd.OptStartTLS, nil, nil); err != nil {
			return nil, ex, err
		}
		tc := tls.Client(conn, o.TLS)
		if err := tc.Handshake(); err != nil {
			return nil, ex, fmt.Errorf("nbd: TLS: %w", err)
		}
		conn = tc
		r = bufio.NewReader(tc)
	}
	if o.Structured {
		err := option(conn, r, nbd.OptStructuredReply, nil, nil)
		var oe *OptionError
		// A server without structured replies answers in simple ones.
		if err != nil && !(errors.As(err, &oe) && oe.Type == nbd.RepErrUnsup) {
			return nil, ex, err
		}
	}
	req := nbd.InfoRequest{Name: export}
	err = option(conn, r, nbd.OptGo, req.Append(nil), func(t nbd.ReplyType, data []byte) {
		if t == nbd.RepInfo {
			if in, err := nbd.ParseInfo(data); err == nil && in.Type == nbd.InfoExport {
				ex.Size, ex.Flags = in.Size, in.Flags
			}
		}
	})
	if err != nil {
		return nil, ex, err
	}
	if r.Buffered() != 0 {
		return nil, ex, errors.New("nbd: server sent data after NBD_OPT_GO")
	}
	return conn, ex, nil
}

// option sends o and reads replies until the ACK, handing others to each.
func option(w io.Writer, r io.Reader, o nbd.Option, data []byte, each func(nbd.ReplyType, []byte)) error {
	if _, err := w.Write(nbd.AppendOption(nil, o, data)); err != nil {
		return err
	}
	hdr := make([]byte, nbd.OptionReplyHeaderLen)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return fmt.Errorf("nbd: %s reply: %w", o, err)
		}
		h, err := nbd.ParseOptionReplyHeader(hdr)
		if err != nil {
			return err
		}
		if h.Length > 1<<20 {
			return fmt.Errorf("nbd: %s reply of %d bytes", o, h.Length)
		}
		body := make([]byte, h.Length)
		if _, err := io.ReadFull(r, body); err != nil {
			return err
		}
		switch {
		case h.Type.IsError():
			return &OptionError{Option: o, Type: h.Type, Message: string(body)}
		case h.Type == nbd.RepAck:
			return nil
		case each != nil:
			each(h.Type, body)
		}
	}
}

// ReadAt reads len(p) bytes at off.
func (c *Client) ReadAt(p []byte, off int64) (int, error) {
	if err := c.do(nbd.Request{Cmd: nbd.CmdRead, Offset: uint64(off), Length: uint32(len(p))}, nil, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt writes p at off; fua asks for it to be durable before the reply.
func (c *Client) WriteAt(p []byte, off int64, fua bool) error {
	var f nbd.CmdFlags
	if fua {
		f = nbd.CmdFlagFUA
	}
	return c.do(nbd.Request{Cmd: nbd.CmdWrite, Flags: f, Offset: uint64(off), Length: uint32(len(p))}, p, nil)
}

// WriteZeroes writes n zero bytes at off, as NBD_CMD_WRITE_ZEROES when
// the server offers it and as a plain write of zeroes when it does not.
func (c *Client) WriteZeroes(off int64, n uint32) error {
	if c.Flags&nbd.FlagSendWriteZeroes != 0 {
		return c.do(nbd.Request{Cmd: nbd.CmdWriteZeroes, Offset: uint64(off), Length: n}, nil, nil)
	}
	return c.WriteAt(make([]byte, n), off, false)
}

// Flush asks the server to make every acknowledged write durable.
func (c *Client) Flush() error { return c.do(nbd.Request{Cmd: nbd.CmdFlush}, nil, nil) }

// Close sends NBD_CMD_DISC (ending the boot on a deskway server) and
// closes the connection.
func (c *Client) Close() error {
	c.wmu.Lock()
	r := nbd.Request{Cmd: nbd.CmdDisc}
	_, err := c.conn.Write(r.Append(nil))
	c.wmu.Unlock()
	c.conn.Close()
	<-c.closed
	return err
}

// Drop closes the connection without NBD_CMD_DISC, as a client that lost
// the network would.
func (c *Client) Drop() {
	c.conn.Close()
	<-c.closed
}

func (c *Client) do(r nbd.Request, payload, dst []byte) error {
	cl := &call{buf: dst, off: r.Offset, done: make(chan error, 1)}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	c.next++
	r.Cookie = c.next
	c.wait[r.Cookie] = cl
	c.mu.Unlock()
	c.wmu.Lock()
	bufs := net.Buffers{r.Append(nil), payload}
	_, err := bufs.WriteTo(c.conn)
	c.wmu.Unlock()
	if err != nil {
		c.conn.Close()
	}
	return <-cl.done
}

func (c *Client) readLoop(r *bufio.Reader) {
	err := c.readReplies(r)
	if err == nil || errors.Is(err, net.ErrClosed) {
		err = net.ErrClosed
	}
	c.mu.Lock()
	c.err = fmt.Errorf("nbd: connection ended: %w", err)
	for k, cl := range c.wait {
		cl.done <- c.err
		delete(c.wait, k)
	}
	c.mu.Unlock()
	close(c.closed)
}

// lookup finds the call waiting for cookie; done also removes it.
func (c *Client) lookup(cookie uint64, done bool) (*call, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.wait[cookie]
	if cl == nil {
		return nil, fmt.Errorf("nbd: reply for unknown cookie %d", cookie)
	}
	if done {
		delete(c.wait, cookie)
	}
	return cl, nil
}

func (c *Client) readReplies(r *bufio.Reader) error {
	hdr := make([]byte, nbd.StructuredHeaderLen)
	for {
		if _, err := io.ReadFull(r, hdr[:4]); err != nil {
			return err
		}
		// With structured replies negotiated a server may still answer
		// commands that carry no data with simple replies.
		if binary.BigEndian.Uint32(hdr) == nbd.SimpleReplyMagic {
			if _, err := io.ReadFull(r, hdr[4:nbd.SimpleReplyLen]); err != nil {
				return err
			}
			sr, err := nbd.ParseSimpleReply(hdr)
			if err != nil {
				return err
			}
			cl, err := c.lookup(sr.Cookie, true)
			if err != nil {
				return err
			}
			if sr.Error != 0 {
				cl.done <- &ServerError{Errno: sr.Error}
				continue
			}
			if _, err := io.ReadFull(r, cl.buf); err != nil {
				cl.done <- err
				return err
			}
			cl.done <- nil
			continue
		}
		if _, err := io.ReadFull(r, hdr[4:]); err != nil {
			return err
		}
		h, err := nbd.ParseChunkHeader(hdr)
		if err != nil {
			return err
		}
		cl, err := c.lookup(h.Cookie, false)
		if err != nil {
			return err
		}
		var cerr error
		switch h.Type {
		case nbd.ChunkOffsetData, nbd.ChunkOffsetHole:
			if h.Length < 8 {
				return fmt.Errorf("nbd: %d-byte offset chunk", h.Length)
			}
			var b [12]byte
			if _, err := io.ReadFull(r, b[:8]); err != nil {
				return err
			}
			n := int64(h.Length) - 8
			if h.Type == nbd.ChunkOffsetHole {
				if h.Length != 12 {
					return fmt.Errorf("nbd: %d-byte hole chunk", h.Length)
				}
				if _, err := io.ReadFull(r, b[8:]); err != nil {
					return err
				}
				n = int64(binary.BigEndian.Uint32(b[8:]))
			}
			// Chunks carry absolute offsets and may come in any order.
			at := int64(binary.BigEndian.Uint64(b[:8])) - int64(cl.off)
			if at < 0 || at+n > int64(len(cl.buf)) {
				return fmt.Errorf("nbd: chunk of %d bytes at %d outside a %d-byte read", n, at, len(cl.buf))
			}
			if h.Type == nbd.ChunkOffsetHole {
				clear(cl.buf[at : at+n])
			} else if _, err := io.ReadFull(r, cl.buf[at:at+n]); err != nil {
				return err
			}
		case nbd.ChunkError, nbd.ChunkErrorOffset:
			body := make([]byte, h.Length)
			if _, err := io.ReadFull(r, body); err != nil {
				return err
			}
			e, msg, perr := nbd.ParseErrorChunk(body)
			if perr != nil {
				return perr
			}
			cerr = &ServerError{Errno: e, Message: msg}
		default:
			if _, err := io.CopyN(io.Discard, r, int64(h.Length)); err != nil {
				return err
			}
		}
		if h.Flags&nbd.ChunkFlagDone != 0 {
			if _, err := c.lookup(h.Cookie, true); err != nil {
				return err
			}
			cl.done <- cerr
		}
	}
}
