package gateway

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/pollread"
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
	close()
}

// headroom is what writeData needs in front of a payload: the largest
// websocket header (10 bytes for a server frame) plus the TSGU data header.
const headroom = 10 + tsgu.DataHeaderLen

// packetReader turns a byte stream into TSGU packets. Its buffer starts
// small and grows only as far as a packet needs, so idle tunnels stay cheap.
type packetReader struct {
	r          io.Reader
	buf        []byte
	start, end int
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
				p.buf = nb
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
	conn net.Conn
	in   wsReader
	pr   packetReader
	// push is the TCP connection under conn's TLS when the listener
	// provided one, for the relay's poll loop; nil otherwise.
	push *pollread.PushConn

	wmu    sync.Mutex // guards writes to conn and closed
	closed bool
	ctl    []byte // scratch for control frames, under wmu
}

func newWSTransport(conn net.Conn, r io.Reader) *wsTransport {
	t := &wsTransport{conn: conn}
	if tc, ok := conn.(*tls.Conn); ok {
		t.push, _ = tc.NetConn().(*pollread.PushConn)
	}
	t.in = wsReader{r: r, t: t}
	t.pr = packetReader{r: &t.in}
	return t
}

func (t *wsTransport) readPacket() ([]byte, error) { return t.pr.next() }

func (t *wsTransport) setReadDeadline(d time.Time) error { return t.conn.SetReadDeadline(d) }

// writePacket sends p as one binary frame.
func (t *wsTransport) writePacket(p []byte) error {
	var hdr [10]byte
	n := putFrameHeader(hdr[:], ws.OpBinary, len(p))
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed {
		return net.ErrClosed
	}
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
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed {
		return net.ErrClosed
	}
	_, err := t.conn.Write(frame[start : headroom+n])
	return err
}

func (t *wsTransport) writeControl(op ws.OpCode, payload []byte) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed {
		return net.ErrClosed
	}
	var hdr [10]byte
	n := putFrameHeader(hdr[:], op, len(payload))
	t.ctl = append(append(t.ctl[:0], hdr[:n]...), payload...)
	_, err := t.conn.Write(t.ctl)
	return err
}

func (t *wsTransport) close() {
	t.wmu.Lock()
	if !t.closed {
		t.closed = true
		_ = t.conn.SetWriteDeadline(time.Now().Add(time.Second))
		var hdr [10]byte
		n := putFrameHeader(hdr[:], ws.OpClose, 2)
		_, _ = t.conn.Write(append(hdr[:n], 0x03, 0xe8)) // 1000 normal closure
	}
	t.wmu.Unlock()
	_ = t.conn.Close()
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
// frame header or control frame across calls, so a read that stops with
// pollread.ErrWouldBlock (the relay's push mode) resumes where it was.
type wsReader struct {
	r      io.Reader
	t      *wsTransport
	left   int64
	mask   [4]byte
	pos    int
	closed bool

	hdr [14]byte // a frame header being read
	hn  int      // bytes of it read so far
	ctl []byte   // a control frame's payload being read
	ctn int      // bytes of it read so far
	cop ws.OpCode
}

// wsHeaderLen is the length of a frame header whose second byte is b1.
func wsHeaderLen(b1 byte) int {
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

func (w *wsReader) Read(p []byte) (int, error) {
	for w.left == 0 {
		if w.closed {
			return 0, io.EOF
		}
		if w.ctl != nil {
			if err := w.readControl(); err != nil {
				return 0, err
			}
			continue
		}
		need := 2
		if w.hn >= 2 {
			need = wsHeaderLen(w.hdr[1])
		}
		for w.hn < need {
			n, err := w.r.Read(w.hdr[w.hn:need])
			w.hn += n
			if w.hn >= 2 {
				need = wsHeaderLen(w.hdr[1])
			}
			if err != nil && w.hn < need {
				if errors.Is(err, io.EOF) && w.hn > 0 {
					err = io.ErrUnexpectedEOF
				}
				return 0, fmt.Errorf("websocket header: %w", err)
			}
		}
		h := w.hdr[:need]
		w.hn = 0
		if h[0]&0x70 != 0 {
			return 0, errors.New("websocket: reserved bits set")
		}
		if h[1]&0x80 == 0 {
			return 0, errors.New("websocket: client frame not masked")
		}
		op := ws.OpCode(h[0] & 0x0f)
		length := int64(h[1] & 0x7f)
		switch length {
		case 126:
			length = int64(binary.BigEndian.Uint16(h[2:]))
		case 127:
			length = int64(binary.BigEndian.Uint64(h[2:]))
		}
		if length < 0 || length > maxFrameLen {
			return 0, fmt.Errorf("websocket: frame of %d bytes over %d", length, maxFrameLen)
		}
		var mask [4]byte
		copy(mask[:], h[need-4:])
		switch op {
		case ws.OpBinary, ws.OpContinuation, ws.OpText:
			w.left, w.mask, w.pos = length, mask, 0
		case ws.OpPing, ws.OpPong, ws.OpClose:
			if length > maxControlPayload {
				return 0, errors.New("websocket: control frame too long")
			}
			w.ctl, w.ctn, w.cop, w.mask = make([]byte, length), 0, op, mask
		default:
			return 0, fmt.Errorf("websocket: unknown opcode %d", op)
		}
	}
	if int64(len(p)) > w.left {
		p = p[:w.left]
	}
	n, err := w.r.Read(p)
	ws.Cipher(p[:n], w.mask, w.pos)
	w.pos += n
	w.left -= int64(n)
	return n, err
}

// readControl finishes reading a control frame and acts on it.
func (w *wsReader) readControl() error {
	for w.ctn < len(w.ctl) {
		n, err := w.r.Read(w.ctl[w.ctn:])
		w.ctn += n
		if err != nil && w.ctn < len(w.ctl) {
			return fmt.Errorf("websocket control frame: %w", err)
		}
	}
	payload, op := w.ctl, w.cop
	w.ctl = nil
	ws.Cipher(payload, w.mask, 0)
	switch op {
	case ws.OpPing:
		return w.t.writeControl(ws.OpPong, payload)
	case ws.OpClose:
		w.closed = true
		return io.EOF
	}
	return nil
}

// legacyTransport is the RDG_IN_DATA (client to gateway, chunked) and
// RDG_OUT_DATA (gateway to client, raw) pair.
type legacyTransport struct {
	in  net.Conn
	out net.Conn
	pr  packetReader

	wmu    sync.Mutex // guards writes to out and closed
	closed bool
}

func (t *legacyTransport) readPacket() ([]byte, error) { return t.pr.next() }

func (t *legacyTransport) setReadDeadline(d time.Time) error { return t.in.SetReadDeadline(d) }

func (t *legacyTransport) writePacket(p []byte) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.closed {
		return net.ErrClosed
	}
	_, err := t.out.Write(p)
	return err
}

func (t *legacyTransport) writeData(frame []byte, n int) error {
	start := headroom - tsgu.DataHeaderLen
	tsgu.PutDataHeader(frame[start:], n)
	return t.writePacket(frame[start : headroom+n])
}

func (t *legacyTransport) close() {
	t.wmu.Lock()
	t.closed = true
	t.wmu.Unlock()
	_ = t.in.Close()
	_ = t.out.Close()
}
