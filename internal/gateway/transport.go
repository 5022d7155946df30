package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
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

	wmu    sync.Mutex // guards writes to conn and closed
	closed bool
	ctl    []byte // scratch for control frames, under wmu
}

func newWSTransport(conn net.Conn, r io.Reader) *wsTransport {
	t := &wsTransport{conn: conn}
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
// stream, answering pings and closes on the way.
type wsReader struct {
	r      io.Reader
	t      *wsTransport
	left   int64
	mask   [4]byte
	pos    int
	closed bool
}

func (w *wsReader) Read(p []byte) (int, error) {
	for w.left == 0 {
		if w.closed {
			return 0, io.EOF
		}
		h, err := ws.ReadHeader(w.r)
		if err != nil {
			return 0, fmt.Errorf("websocket header: %w", err)
		}
		if !h.Masked {
			return 0, errors.New("websocket: client frame not masked")
		}
		if h.Length > maxFrameLen {
			return 0, fmt.Errorf("websocket: frame of %d bytes over %d", h.Length, maxFrameLen)
		}
		switch h.OpCode {
		case ws.OpBinary, ws.OpContinuation, ws.OpText:
			w.left, w.mask, w.pos = h.Length, h.Mask, 0
		case ws.OpPing, ws.OpPong, ws.OpClose:
			if h.Length > maxControlPayload {
				return 0, errors.New("websocket: control frame too long")
			}
			payload := make([]byte, h.Length)
			if _, err := io.ReadFull(w.r, payload); err != nil {
				return 0, fmt.Errorf("websocket control frame: %w", err)
			}
			ws.Cipher(payload, h.Mask, 0)
			switch h.OpCode {
			case ws.OpPing:
				if err := w.t.writeControl(ws.OpPong, payload); err != nil {
					return 0, err
				}
			case ws.OpClose:
				w.closed = true
				return 0, io.EOF
			}
		default:
			return 0, fmt.Errorf("websocket: unknown opcode %d", h.OpCode)
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
