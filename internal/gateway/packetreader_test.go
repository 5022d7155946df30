package gateway

import (
	"bytes"
	"errors"
	"testing"

	"github.com/deskway/deskway/internal/proto/tsgu"
)

// TestPacketReaderKeepsPartialPacketsPastALend: a reader that borrows a
// relay loop's buffer while it drains keeps the bytes of a packet not yet
// whole in a buffer of its own when it gives the loop's back, so the loop
// reusing its buffer for other tunnels corrupts nothing, and it holds no
// buffer at all between whole packets.
func TestPacketReaderKeepsPartialPacketsPastALend(t *testing.T) {
	var stream []byte
	var want [][]byte
	for i, size := range []int{90, 1, 3000, 700} {
		payload := bytes.Repeat([]byte{byte('a' + i)}, size)
		pkt, err := tsgu.AppendData(nil, payload)
		if err != nil {
			t.Fatal(err)
		}
		stream = append(stream, pkt...)
		want = append(want, pkt)
	}
	d := &dribble{b: stream}
	p := packetReader{r: d}
	shared := make([]byte, loopPacketBuf)
	var got [][]byte
	for len(got) < len(want) {
		p.lend(shared)
		for {
			pkt, err := p.next()
			if errors.Is(err, errWouldBlock) {
				break
			}
			if err != nil {
				t.Fatalf("packet %d: %v", len(got), err)
			}
			got = append(got, bytes.Clone(pkt))
		}
		p.giveBack()
		// Another tunnel's bytes in the loop's buffer.
		for i := range shared {
			shared[i] = 0xAA
		}
		if p.start == p.end && p.buf != nil {
			t.Fatalf("after packet %d the reader keeps a %d-byte buffer with nothing in it", len(got), cap(p.buf))
		}
		if d.stalls > 2*len(stream)+2 {
			t.Fatal("the stream ended before every packet came out")
		}
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("packet %d differs from what was sent", i)
		}
	}
}
