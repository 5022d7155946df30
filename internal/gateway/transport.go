package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/proto/tsgu"
)

// transport carries TSGU packets between the client and the gateway, over a
// websocket or over the legacy IN/OUT pair. Reads happen on one goroutine;
// writes may come from several and are serialized inside.
type transport interface {
	// readPacket returns the next whole packet; it stays valid until the next call.
	readPacket() ([]byte, error)
	// writePacket sends one or more whole packets.
	writePacket(p []byte) error
	// writeData sends frame[headroom:] after filling the headers in frame[:headroom];
	// the TSGU data header sits at frame[headroom-tsgu.DataHeaderLen:headroom].
	writeData(frame []byte, n int) error
	setReadDeadline(t time.Time) error
	// close ends the transport from any goroutine without ever waiting on
	// a blocked write: final packets are sent first only if no write holds
	// the connection within closeWait, and with a deadline of their own.
	close(final ...[]byte)
}

// closeWait is how long close waits for a write in progress before it
// gives up on sending its final packets; closeWriteTimeout bounds those.
const (
	closeWait         = 200 * time.Millisecond
	closeWriteTimeout = time.Second
)

// writeGate serializes the writes of one connection. Unlike a mutex it
// can be tried with a deadline, so a closer is never stuck behind a
// writer; and every write made through it has a deadline, so a peer that
// stops reading frees it after the write timeout at the latest.
type writeGate struct {
	ch      chan struct{}
	conn    net.Conn // where deadlines are set
	timeout time.Duration
	closed  atomic.Bool
	// onLoop is set once an event loop owns the socket: its writes never
	// block and the loop times stalls, so no deadline is set per write.
	onLoop atomic.Bool
}

func newWriteGate(conn net.Conn, timeout time.Duration) writeGate {
	return writeGate{ch: make(chan struct{}, 1), conn: conn, timeout: timeout}
}

// lock waits for the gate and arms the write deadline; it fails once the
// transport is closed.
func (g *writeGate) lock() error {
	g.ch <- struct{}{}
	if g.closed.Load() {
		<-g.ch
		return net.ErrClosed
	}
	if !g.onLoop.Load() {
		_ = g.conn.SetWriteDeadline(time.Now().Add(g.timeout))
	}
	return nil
}

func (g *writeGate) unlock() { <-g.ch }

// shut marks the gate closed and, if it is free within closeWait, runs
// last (a final write) under a short deadline. It reports whether it was
// the first to close.
func (g *writeGate) shut(last func()) bool {
	if g.closed.Swap(true) {
		return false
	}
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case g.ch <- struct{}{}:
		_ = g.conn.SetWriteDeadline(time.Now().Add(closeWriteTimeout))
		last()
		<-g.ch
	case <-t.C:
	}
	return true
}

// headroom is what writeData needs in front of a payload: the largest
// websocket header (10 bytes for a server frame) plus the TSGU data header.
const headroom = 10 + tsgu.DataHeaderLen

// packetReader turns a byte stream into TSGU packets. Its buffer starts
// small and grows only as far as a packet needs, so idle tunnels stay cheap;
// on a relay loop it borrows the loop's buffer instead (see lend).
type packetReader struct {
	r          io.Reader
	buf        []byte
	start, end int
	lent       bool // buf is a relay loop's, until giveBack
}

// lend has the reader read into buf, a relay loop's, until giveBack,
// when it holds no bytes of its own: between messages a tunnel on a loop
// then keeps no reader buffer, as HAProxy holds buffers only while data
// is in flight.
func (p *packetReader) lend(buf []byte) {
	if p.start == p.end {
		p.buf, p.start, p.end, p.lent = buf, 0, 0, true
	}
}

// giveBack ends a lend: the bytes of a packet not yet whole (or of
// packets the relay held back) move to a buffer of the reader's own, just
// large enough for them, and a reader left with no bytes keeps no buffer.
func (p *packetReader) giveBack() {
	held := p.buf[p.start:p.end]
	switch {
	case len(held) == 0:
		p.buf, p.start, p.end = nil, 0, 0
	case p.lent:
		own := make([]byte, max(initialReadBuf, len(held)))
		p.buf, p.start, p.end = own, 0, copy(own, held)
	}
	p.lent = false
}

const initialReadBuf = 512

func (p *packetReader) next() ([]byte, error) {
	for {
		if p.end > p.start {
			pkt, n, err := tsgu.Split(p.buf[p.start:p.end])
			if err != nil {
				return nil, err
			}
			if n > 0 {
				p.start += n
				return pkt, nil
			}
		}
		if p.start == p.end {
			p.start, p.end = 0, 0
		}
		need := tsgu.HeaderLen
		if p.end-p.start >= tsgu.HeaderLen {
			h, _ := tsgu.ParseHeader(p.buf[p.start:p.end])
			need = int(h.Length)
		}
		if p.buf == nil {
			p.buf = make([]byte, max(initialReadBuf, need))
		}
		if p.start+need > len(p.buf) {
			// Compact, and grow if the packet is larger than the buffer.
			if need > len(p.buf) {
				nb := make([]byte, need)
				copy(nb, p.buf[p.start:p.end])
				p.buf, p.lent = nb, false
			} else {
				copy(p.buf, p.buf[p.start:p.end])
			}
			p.end -= p.start
			p.start = 0
		}
		n, err := p.r.Read(p.buf[p.end:])
		p.end += n
		if err != nil {
			if n > 0 {
				continue
			}
			if errors.Is(err, io.EOF) && p.end > p.start {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// wsTransport is a websocket connection after the 101 response.
type wsTransport struct {
	conn net.Conn // the TLS connection
	raw  net.Conn // beneath TLS: closing it never waits on a TLS write
	in   wsReader
	pr   packetReader

	g   writeGate // serializes writes to conn
	ctl []byte    // scratch for control frames, behind g
}

func newWSTransport(conn, raw net.Conn, r io.Reader, writeTimeout time.Duration) *wsTransport {
	t := &wsTransport{conn: conn, raw: raw, g: newWriteGate(conn, writeTimeout)}
	t.in = wsReader{r: r, t: t}
	t.pr = packetReader{r: &t.in}
	return t
}

func (t *wsTransport) readPacket() ([]byte, error) { return t.pr.next() }

func (t *wsTransport) setReadDeadline(d time.Time) error { return t.conn.SetReadDeadline(d) }

// writePacket sends p as one binary frame in one write, so one TLS
// record. Written apart, the frame's header went out as a record and a
// system call of its own, and the reply reached the client later: in
// the handshake FreeRDP 2 reads right after each request and sleeps
// 10 ms when the reply is not all there.
func (t *wsTransport) writePacket(p []byte) error {
	var hdr [10]byte
	n := putFrameHeader(hdr[:], ws.OpBinary, len(p))
	b := append(append(make([]byte, 0, n+len(p)), hdr[:n]...), p...)
	if err := t.g.lock(); err != nil {
		return err
	}
	defer t.g.unlock()
	_, err := t.conn.Write(b)
	return err
}

func (t *wsTransport) writeFrameLocked(op ws.OpCode, p []byte) error {
	var hdr [10]byte
	n := putFrameHeader(hdr[:], op, len(p))
	bufs := net.Buffers{hdr[:n], p}
	_, err := bufs.WriteTo(t.conn)
	return err
}

func (t *wsTransport) writeData(frame []byte, n int) error {
	tsgu.PutDataHeader(frame[headroom-tsgu.DataHeaderLen:], n)
	var hdr [10]byte
	hl := putFrameHeader(hdr[:], ws.OpBinary, n+tsgu.DataHeaderLen)
	start := headroom - tsgu.DataHeaderLen - hl
	copy(frame[start:], hdr[:hl])
	if err := t.g.lock(); err != nil {
		return err
	}
	defer t.g.unlock()
	_, err := t.conn.Write(frame[start : headroom+n])
	return err
}

func (t *wsTransport) writeControl(op ws.OpCode, payload []byte) error {
	if err := t.g.lock(); err != nil {
		return err
	}
	defer t.g.unlock()
	var hdr [10]byte
	n := putFrameHeader(hdr[:], op, len(payload))
	t.ctl = append(append(t.ctl[:0], hdr[:n]...), payload...)
	_, err := t.conn.Write(t.ctl)
	return err
}

func (t *wsTransport) close(final ...[]byte) {
	t.g.shut(func() {
		for _, p := range final {
			_ = t.writeFrameLocked(ws.OpBinary, p)
		}
		_ = t.writeFrameLocked(ws.OpClose, []byte{0x03, 0xe8}) // 1000 normal closure
	})
	_ = t.raw.Close()
}

// putFrameHeader writes an unmasked server frame header (RFC 6455 5.2).
func putFrameHeader(b []byte, op ws.OpCode, n int) int {
	b[0] = 0x80 | byte(op)
	switch {
	case n < 126:
		b[1] = byte(n)
		return 2
	case n <= 0xFFFF:
		b[1] = 126
		b[2], b[3] = byte(n>>8), byte(n)
		return 4
	default:
		b[1] = 127
		for i := 0; i < 8; i++ {
			b[2+i] = byte(uint64(n) >> (56 - 8*i))
		}
		return 10
	}
}

// maxControlPayload and maxFrameLen bound what a client frame may claim.
const (
	maxControlPayload = 125
	maxFrameLen       = 1 << 20
)

// wsReader presents the payloads of a client's data frames as one byte
// stream, answering pings and closes on the way. It keeps a partly read
// frame header or control payload across reads, so it can sit on a
// reader that runs dry mid-frame (errWouldBlock) and resume once fed.
type wsReader struct {
	r      io.Reader
	t      *wsTransport
	left   int64
	mask   [4]byte
	pos    int
	closed bool

	hdr  [14]byte // a frame header being read
	hn   int
	ctl  []byte // a control frame's payload being read, after its header
	cn   int
	ctlH frameHeader

	// fin is the last data frame's FIN bit: its message ends with it.
	fin bool
	// continued is whether the last data frame was a continuation.
	continued bool
	// inflate is set when the client negotiated permessage-deflate: its
	// messages may then come compressed (see inflater).
	inflate *inflater
}

// frameHeader is what the relay needs of a client frame header (RFC 6455 5.2).
type frameHeader struct {
	op     ws.OpCode
	fin    bool
	rsv1   bool // permessage-deflate's "compressed" bit
	masked bool
	length int64
	mask   [4]byte
}

// headerLen is the length of the frame header starting with b0 b1.
func headerLen(b1 byte) int {
	n := 2
	switch b1 & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if b1&0x80 != 0 {
		n += 4
	}
	return n
}

// parseFrameHeader decodes a whole header as sized by headerLen. RSV1 is
// left to the caller, which knows whether an extension gave it a meaning.
func parseFrameHeader(b []byte) (frameHeader, error) {
	var h frameHeader
	if b[0]&0x30 != 0 {
		return h, errors.New("websocket: reserved bits set without an extension")
	}
	h.fin = b[0]&0x80 != 0
	h.rsv1 = b[0]&0x40 != 0
	h.op = ws.OpCode(b[0] & 0x0f)
	h.masked = b[1]&0x80 != 0
	i := 2
	switch l := b[1] & 0x7f; l {
	case 126:
		h.length = int64(b[2])<<8 | int64(b[3])
		i = 4
	case 127:
		var v uint64
		for k := 0; k < 8; k++ {
			v = v<<8 | uint64(b[2+k])
		}
		if v > 1<<62 {
			return h, fmt.Errorf("websocket: frame length %d", v)
		}
		h.length = int64(v)
		i = 10
	default:
		h.length = int64(l)
	}
	if h.masked {
		copy(h.mask[:], b[i:i+4])
	}
	return h, nil
}

// fill reads into b[*n:] until it is full; on error the progress stays in *n.
func (w *wsReader) fill(b []byte, n *int) error {
	for *n < len(b) {
		k, err := w.r.Read(b[*n:])
		*n += k
		if err != nil {
			if *n == len(b) {
				return nil
			}
			if errors.Is(err, io.EOF) && *n > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

func (w *wsReader) Read(p []byte) (int, error) {
	if w.inflate != nil {
		return w.inflate.read(w, p)
	}
	for w.left == 0 {
		if _, err := w.frame(); err != nil {
			return 0, err
		}
	}
	return w.payload(p)
}

// frame reads frame headers, answering control frames, up to the next
// data frame's; it reports whether that frame is marked compressed.
func (w *wsReader) frame() (compressed bool, err error) {
	for {
		if w.closed {
			return false, io.EOF
		}
		if w.ctl == nil {
			if err := w.fill(w.hdr[:2], &w.hn); err != nil {
				return false, wsHeaderErr(err)
			}
			if err := w.fill(w.hdr[:headerLen(w.hdr[1])], &w.hn); err != nil {
				return false, wsHeaderErr(err)
			}
			h, err := parseFrameHeader(w.hdr[:w.hn])
			w.hn = 0
			if err != nil {
				return false, err
			}
			if !h.masked {
				return false, errors.New("websocket: client frame not masked")
			}
			if h.length > maxFrameLen {
				return false, fmt.Errorf("websocket: frame of %d bytes over %d", h.length, maxFrameLen)
			}
			if h.rsv1 && (w.inflate == nil || h.op == ws.OpContinuation || h.op.IsControl()) {
				// RFC 7692 6: only a message's first frame is marked.
				return false, errors.New("websocket: compressed bit set where no compression applies")
			}
			switch h.op {
			case ws.OpBinary, ws.OpContinuation, ws.OpText:
				w.left, w.mask, w.pos = h.length, h.mask, 0
				w.fin, w.continued = h.fin, h.op == ws.OpContinuation
				return h.rsv1, nil
			case ws.OpPing, ws.OpPong, ws.OpClose:
				if h.length > maxControlPayload {
					return false, errors.New("websocket: control frame too long")
				}
				w.ctlH, w.ctl, w.cn = h, make([]byte, h.length), 0
			default:
				return false, fmt.Errorf("websocket: unknown opcode %d", h.op)
			}
		}
		if err := w.fill(w.ctl, &w.cn); err != nil {
			if !errors.Is(err, errWouldBlock) {
				err = fmt.Errorf("websocket control frame: %w", err)
			}
			return false, err
		}
		payload, h := w.ctl, w.ctlH
		w.ctl = nil
		ws.Cipher(payload, h.mask, 0)
		switch h.op {
		case ws.OpPing:
			if err := w.t.writeControl(ws.OpPong, payload); err != nil {
				return false, err
			}
		case ws.OpClose:
			w.closed = true
			return false, io.EOF
		}
	}
}

// payload reads the current data frame's payload, of which w.left bytes
// are still due.
func (w *wsReader) payload(p []byte) (int, error) {
	if int64(len(p)) > w.left {
		p = p[:w.left]
	}
	n, err := w.r.Read(p)
	ws.Cipher(p[:n], w.mask, w.pos)
	w.pos += n
	w.left -= int64(n)
	if n > 0 && errors.Is(err, errWouldBlock) {
		err = nil
	}
	return n, err
}

// wsHeaderErr adds context to a failed header read, except a dry push
// reader's, which only means later.
func wsHeaderErr(err error) error {
	if errors.Is(err, errWouldBlock) {
		return err
	}
	return fmt.Errorf("websocket header: %w", err)
}

// legacyTransport is the RDG_IN_DATA (client to gateway, chunked) and
// RDG_OUT_DATA (gateway to client, raw) pair; in and out are the TLS
// connections, inRaw and outRaw what is beneath them.
type legacyTransport struct {
	in, inRaw   net.Conn
	out, outRaw net.Conn
	pr          packetReader
	g           writeGate // serializes writes to out
}

func (t *legacyTransport) readPacket() ([]byte, error) { return t.pr.next() }

func (t *legacyTransport) setReadDeadline(d time.Time) error { return t.in.SetReadDeadline(d) }

func (t *legacyTransport) writePacket(p []byte) error {
	if err := t.g.lock(); err != nil {
		return err
	}
	defer t.g.unlock()
	_, err := t.out.Write(p)
	return err
}

func (t *legacyTransport) writeData(frame []byte, n int) error {
	start := headroom - tsgu.DataHeaderLen
	tsgu.PutDataHeader(frame[start:], n)
	return t.writePacket(frame[start : headroom+n])
}

func (t *legacyTransport) close(final ...[]byte) {
	t.g.shut(func() {
		for _, p := range final {
			_, _ = t.out.Write(p)
		}
	})
	_ = t.inRaw.Close()
	_ = t.outRaw.Close()
}
