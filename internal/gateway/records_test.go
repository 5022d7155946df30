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
// and a websocket one and reads the gateway's "tunnel open" lines:
// open_ms, the gateway's part of the client's wait, runs from accepting
// the first connection, so it is above zero and below the time the test
// took to open it; http_ms, served_ms and dial_ms, the gateway's own
// working time in it (answering the HTTP requests, the TSGU handshake
// with the dial, the dial alone), are above zero and together within
// open_ms.
func TestTunnelOpenLogsItsOpenTime(t *testing.T) {
	h := start(t, nil)
	re := regexp.MustCompile(`msg="tunnel open".* open_ms=([0-9.]+) http_ms=([0-9.]+) served_ms=([0-9.]+) dial_ms=([0-9.]+)`)
	for i, kind := range []string{tsgclient.Legacy, tsgclient.Websocket} {
		cfg := h.cfg("", "", kind)
		cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
		began := time.Now()
		c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(began)
		echoRoundTrip(t, c, 10)
		c.Close()
		lines := re.FindAllStringSubmatch(h.logs.String(), -1)
		if len(lines) != i+1 {
			t.Fatalf("%v: %d tunnel open lines with open_ms, http_ms, served_ms and dial_ms, want %d:\n%s", kind, len(lines), i+1, h.logs.String())
		}
		var v [4]float64
		for j := range v {
			v[j], _ = strconv.ParseFloat(lines[i][j+1], 64)
		}
		open, httpMS, served, dialMS := v[0], v[1], v[2], v[3]
		if open <= 0 || open > float64(took.Microseconds())/1000 {
			t.Errorf("%v: open_ms %v; the client took %v to open the tunnel", kind, open, took)
		}
		if httpMS <= 0 || served <= 0 || dialMS <= 0 || dialMS > served || httpMS+served > open {
			t.Errorf("%v: http_ms %v, served_ms %v, dial_ms %v: each above zero, the dial within served_ms, the two within open_ms %v", kind, httpMS, served, dialMS, open)
		}
	}
}
