package gateway_test

import (
	"context"
	"encoding/binary"
	"net"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/tsgclient"
)

// recordLens is a client's TCP connection that notes the length of each
// TLS application-data record the server sends.
type recordLens struct {
	net.Conn
	mu   sync.Mutex
	buf  []byte
	lens []int
}

func (c *recordLens) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p[:n]...)
	for len(c.buf) >= 5 {
		l := int(binary.BigEndian.Uint16(c.buf[3:5]))
		if len(c.buf) < 5+l {
			break
		}
		if c.buf[0] == 23 {
			c.lens = append(c.lens, l)
		}
		c.buf = c.buf[5+l:]
	}
	return n, err
}

// TestWebsocketHandshakeRepliesAreOneRecordEach opens a websocket tunnel
// and reads the TLS records the gateway sent: no websocket frame header
// may travel in a record of its own (2 bytes, 19 on the wire with TLS
// 1.3's tag and content type). A header written apart from its payload
// cost the client a read that found the reply unfinished, and FreeRDP
// 2 sleeps 10 ms then.
func TestWebsocketHandshakeRepliesAreOneRecordEach(t *testing.T) {
	h := start(t, nil)
	var conn *recordLens
	cfg := h.cfg("", "", tsgclient.Websocket)
	cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn = &recordLens{Conn: c}
		return conn, nil
	}
	c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echoRoundTrip(t, c, 10)
	conn.mu.Lock()
	defer conn.mu.Unlock()
	// The 101 response and four handshake replies at least: the count
	// shows the records were read at all.
	if len(conn.lens) < 5 {
		t.Fatalf("%d application-data records from the gateway (%v): the connection was not read", len(conn.lens), conn.lens)
	}
	for i, l := range conn.lens {
		if l == 19 {
			t.Errorf("record %d of %v carries 2 bytes: a websocket header sent apart from its payload", i, conn.lens)
		}
	}
}

// TestTunnelOpenLogsItsOpenTime opens a legacy tunnel (two connections)
// and reads the gateway's "tunnel open" line: open_ms, the gateway's
// part of the client's wait, runs from accepting the first connection,
// so it is above zero and below the time the test took to open it.
func TestTunnelOpenLogsItsOpenTime(t *testing.T) {
	h := start(t, nil)
	cfg := h.cfg("", "", tsgclient.Legacy)
	cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
	began := time.Now()
	c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	defer c.Close()
	echoRoundTrip(t, c, 10)
	re := regexp.MustCompile(`msg="tunnel open".* open_ms=([0-9.]+)`)
	m := re.FindStringSubmatch(h.logs.String())
	if m == nil {
		t.Fatalf("no tunnel open line with open_ms:\n%s", h.logs.String())
	}
	ms, _ := strconv.ParseFloat(m[1], 64)
	if ms <= 0 || ms > float64(took.Microseconds())/1000 {
		t.Errorf("open_ms %v; the client took %v to open the tunnel", ms, took)
	}
}
