package tsgclient

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/deskway/deskway/internal/proto/tsgu"
)

type sinkRecorder struct{ sent [][]byte }

func (s *sinkRecorder) send(p []byte) error {
	s.sent = append(s.sent, append([]byte(nil), p...))
	return nil
}

func packets(t *testing.T, ms ...tsgu.Message) []byte {
	t.Helper()
	var b []byte
	for _, m := range ms {
		var err error
		if b, err = m.Append(b); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// TestReadPayloadAcrossPackets reads data packets split at every byte,
// with control packets between them, as the gateway may send them.
func TestReadPayloadAcrossPackets(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 5000)
	stream := packets(t,
		&tsgu.Data{Payload: []byte("hello ")},
		&tsgu.Keepalive{},
		&tsgu.Data{Payload: nil},
		&tsgu.ServiceMessage{Message: "maintenance at six"},
		&tsgu.Data{Payload: big[:tsgu.MaxDataLen]},
		&tsgu.Data{Payload: []byte("world")},
		&tsgu.CloseChannel{StatusCode: 0x1234},
	)
	for name, r := range map[string]io.Reader{
		"whole":    bytes.NewReader(stream),
		"one byte": iotest.OneByteReader(bytes.NewReader(stream)),
		"halves":   iotest.HalfReader(bytes.NewReader(stream)),
	} {
		t.Run(name, func(t *testing.T) {
			sink := &sinkRecorder{}
			c := &Conn{r: &packetStream{r: r}, w: sink}
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatal(err)
			}
			want := append(append([]byte("hello "), big[:tsgu.MaxDataLen]...), "world"...)
			if !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes, want %d; equal prefix %d", len(got), len(want), commonPrefix(got, want))
			}
			if c.ServiceMessage != "maintenance at six" || c.CloseStatus != 0x1234 {
				t.Errorf("service message %q, close status %#x", c.ServiceMessage, c.CloseStatus)
			}
			if len(sink.sent) != 1 {
				t.Fatalf("sent %d packets, want the close channel response", len(sink.sent))
			}
			if h, _ := tsgu.ParseHeader(sink.sent[0]); h.Type != tsgu.TypeCloseChannelResponse {
				t.Errorf("sent %v, want close channel response", h.Type)
			}
		})
	}
}

// TestReadRefusesBadDataLength: a data packet whose length disagrees
// with its payload length cannot be framed, and must not be guessed at.
func TestReadRefusesBadDataLength(t *testing.T) {
	p := packets(t, &tsgu.Data{Payload: []byte("abcdef")})
	p[4]++ // packet length one longer than header and payload
	c := &Conn{r: &packetStream{r: bytes.NewReader(append(p, 0))}, w: &sinkRecorder{}}
	if _, err := c.Read(make([]byte, 16)); err == nil {
		t.Fatal("read a data packet whose length disagrees with its payload")
	}
}

// TestReadCutMidPayload: a stream that ends inside a payload is an
// unexpected EOF, not a clean end.
func TestReadCutMidPayload(t *testing.T) {
	p := packets(t, &tsgu.Data{Payload: []byte("abcdef")})
	c := &Conn{r: &packetStream{r: bytes.NewReader(p[:len(p)-2])}, w: &sinkRecorder{}}
	_, err := io.ReadAll(c)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v, want unexpected EOF", err)
	}
}

func commonPrefix(a, b []byte) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}
