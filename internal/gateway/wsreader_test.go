package gateway

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/pollread"
	"github.com/deskway/deskway/internal/proto/tsgu"
)

// trickle hands out one byte per Read and reports ErrWouldBlock between
// bytes, the worst a push-mode relay can see.
type trickle struct {
	data    []byte
	blocked bool
}

func (t *trickle) Read(p []byte) (int, error) {
	if len(t.data) == 0 {
		return 0, io.EOF
	}
	if t.blocked = !t.blocked; t.blocked {
		return 0, pollread.ErrWouldBlock
	}
	p[0] = t.data[0]
	t.data = t.data[1:]
	return 1, nil
}

func clientFrame(op ws.OpCode, payload []byte) []byte {
	var b bytes.Buffer
	f := ws.NewFrame(op, true, bytes.Clone(payload))
	f = ws.MaskFrameInPlace(f)
	if err := ws.WriteFrame(&b, f); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// TestWSReaderResumes reads packets split into single bytes, with a ping
// and frames of every header size on the way, retrying after each
// ErrWouldBlock: the packets come out whole and the ping is answered.
func TestWSReaderResumes(t *testing.T) {
	var stream []byte
	var want [][]byte
	// One packet per frame with 7- and 16-bit lengths, then two packets
	// in one frame with a 64-bit length.
	for _, sizes := range [][]int{{10}, {200}, {40000, 40000}} {
		var frame []byte
		for _, n := range sizes {
			pkt, err := (&tsgu.Data{Payload: bytes.Repeat([]byte{byte(n)}, n)}).Append(nil)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, pkt)
			frame = append(frame, pkt...)
		}
		stream = append(stream, clientFrame(ws.OpBinary, frame)...)
		stream = append(stream, clientFrame(ws.OpPing, []byte("hi"))...)
	}
	server, client := net.Pipe()
	defer server.Close()
	pongs := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(client)
		pongs <- b
	}()
	wt := newWSTransport(server, &trickle{data: stream})
	for i := 0; i < len(want); {
		pkt, err := wt.readPacket()
		if errors.Is(err, pollread.ErrWouldBlock) {
			continue
		}
		if err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		if !bytes.Equal(pkt, want[i]) {
			t.Fatalf("packet %d differs (%d bytes, want %d)", i, len(pkt), len(want[i]))
		}
		i++
	}
	server.Close()
	if got := <-pongs; !bytes.Contains(got, []byte{0x8a, 2, 'h', 'i'}) {
		t.Fatalf("no pong for the pings: %x", got)
	}
}
