package gateway

import (
	"time"

	"bytes"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/gobwas/ws"
)

// dribble hands out its bytes one at a time, reporting errWouldBlock
// before each, as a loopConn does when the loop has pushed nothing yet.
type dribble struct {
	b      []byte
	dry    bool
	stalls int
}

func (d *dribble) Read(p []byte) (int, error) {
	if d.dry = !d.dry; d.dry {
		d.stalls++
		return 0, errWouldBlock
	}
	if len(d.b) == 0 {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = d.b[0]
	d.b = d.b[1:]
	return 1, nil
}

// writeCapture is a net.Conn that records writes (the pongs).
type writeCapture struct {
	net.Conn
	out bytes.Buffer
}

func (w *writeCapture) Write(p []byte) (int, error) { return w.out.Write(p) }

func (w *writeCapture) SetWriteDeadline(time.Time) error { return nil }

// clientFrame builds a masked client frame.
func clientFrame(op ws.OpCode, fin bool, payload []byte) []byte {
	f := ws.NewFrame(op, fin, bytes.Clone(payload))
	f.Header.Masked = true
	f.Header.Mask = [4]byte{0x11, 0x22, 0x33, 0x44}
	ws.Cipher(f.Payload, f.Header.Mask, 0)
	var b bytes.Buffer
	if err := ws.WriteFrame(&b, f); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// readAll reads w to the end, retrying after errWouldBlock.
func readAll(w *wsReader) ([]byte, error) {
	var out []byte
	buf := make([]byte, 7)
	for {
		n, err := w.Read(buf)
		out = append(out, buf[:n]...)
		if errors.Is(err, errWouldBlock) {
			continue
		}
		if err != nil {
			return out, err
		}
	}
}

func newTestWSReader(r io.Reader) (*wsReader, *writeCapture) {
	c := &writeCapture{}
	t := &wsTransport{conn: c, raw: c, g: newWriteGate(c, time.Second)}
	t.in = wsReader{r: r, t: t}
	return &t.in, c
}

func TestWSReaderResumesMidFrame(t *testing.T) {
	long := bytes.Repeat([]byte("0123456789"), 7000) // a 64-bit length header
	var stream []byte
	stream = append(stream, clientFrame(ws.OpBinary, false, []byte("hello, "))...)
	stream = append(stream, clientFrame(ws.OpPing, true, []byte("are you there"))...)
	stream = append(stream, clientFrame(ws.OpContinuation, true, []byte("world"))...)
	stream = append(stream, clientFrame(ws.OpBinary, true, bytes.Repeat([]byte{0xab}, 300))...) // 16-bit length
	stream = append(stream, clientFrame(ws.OpBinary, true, long)...)
	stream = append(stream, clientFrame(ws.OpClose, true, []byte{0x03, 0xe8})...)
	want := append(append([]byte("hello, world"), bytes.Repeat([]byte{0xab}, 300)...), long...)

	whole, wholeOut := newTestWSReader(bytes.NewReader(stream))
	got, err := readAll(whole)
	if !errors.Is(err, io.EOF) || !bytes.Equal(got, want) {
		t.Fatalf("in one piece: %d bytes, %v", len(got), err)
	}
	d := &dribble{b: stream}
	dribbled, dribbledOut := newTestWSReader(d)
	got, err = readAll(dribbled)
	if !errors.Is(err, io.EOF) || !bytes.Equal(got, want) {
		t.Fatalf("a byte at a time: %d bytes, %v", len(got), err)
	}
	if d.stalls < len(stream) {
		t.Fatalf("the reader ran dry only %d times", d.stalls)
	}
	pong := []byte{0x8a, 13}
	pong = append(pong, "are you there"...)
	if !bytes.Equal(wholeOut.out.Bytes(), pong) || !bytes.Equal(dribbledOut.out.Bytes(), pong) {
		t.Fatalf("pongs: %x and %x, want %x", wholeOut.out.Bytes(), dribbledOut.out.Bytes(), pong)
	}
}

func TestWSReaderRefuses(t *testing.T) {
	unmasked := []byte{0x82, 0x01, 'x'}
	reserved := clientFrame(ws.OpBinary, true, []byte("x"))
	reserved[0] |= 0x40
	longPing := clientFrame(ws.OpPing, true, bytes.Repeat([]byte{1}, 126))
	huge := []byte{0x82, 0xff, 0, 0, 0, 0, 0x10, 0, 0, 0, 1, 2, 3, 4}
	for name, in := range map[string][]byte{"unmasked": unmasked, "reserved bits": reserved, "long ping": longPing, "huge": huge, "opcode": {0x83, 0x80, 1, 2, 3, 4}} {
		w, _ := newTestWSReader(&dribble{b: in})
		if _, err := readAll(w); err == nil || errors.Is(err, io.EOF) {
			t.Errorf("%s: %v, want an error", name, err)
		}
	}
	w, _ := newTestWSReader(&dribble{b: clientFrame(ws.OpBinary, true, []byte("abc"))[:4]})
	if _, err := readAll(w); !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		t.Errorf("cut frame: %v", err)
	}
}

// FuzzWSReaderDribble checks that reading a stream a byte at a time, with
// the reader running dry before every byte, gives exactly what reading it
// in one piece gives.
func FuzzWSReaderDribble(f *testing.F) {
	f.Add(append(clientFrame(ws.OpBinary, false, []byte("ab")), clientFrame(ws.OpContinuation, true, []byte("cd"))...))
	f.Add(clientFrame(ws.OpPing, true, []byte("p")))
	f.Add([]byte{0x82, 0xfe, 0x01})
	f.Fuzz(func(t *testing.T, in []byte) {
		whole, wo := newTestWSReader(bytes.NewReader(in))
		a, errA := readAll(whole)
		dribbled, do := newTestWSReader(&dribble{b: in})
		b, errB := readAll(dribbled)
		if !bytes.Equal(a, b) {
			t.Fatalf("payloads differ: %x vs %x", a, b)
		}
		if (errA == nil) != (errB == nil) || errors.Is(errA, io.EOF) != errors.Is(errB, io.EOF) {
			t.Fatalf("errors differ: %v vs %v", errA, errB)
		}
		if !bytes.Equal(wo.out.Bytes(), do.out.Bytes()) {
			t.Fatal("control answers differ")
		}
	})
}
