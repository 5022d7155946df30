package gateway_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/klauspost/compress/flate"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/rdcleanpath"
	"github.com/deskway/deskway/internal/proto/x224"
)

// chromiumOffer is the extension offer Chromium sends on every websocket.
const chromiumOffer = "permessage-deflate; client_max_window_bits"

// deflateConn is a browser's websocket that offered permessage-deflate:
// it compresses what it sends, without context takeover as the gateway
// asks, and inflates what it gets, keeping the gateway's context when
// the gateway keeps it.
type deflateConn struct {
	*browserConn
	accepted string // the gateway's Sec-WebSocket-Extensions
	history  []byte // what the gateway sent so far, its deflate window
	wire     int    // payload bytes received
	rsv1     int    // messages received compressed
}

func openDeflate(t *testing.T, h *harness, offer string) *deflateConn {
	t.Helper()
	conn, err := tls.Dial("tcp", h.addr, h.clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "GET /rdp HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: " + portalOrigin + "\r\nSec-WebSocket-Extensions: " + offer + "\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	return &deflateConn{browserConn: &browserConn{conn: conn, br: br}, accepted: resp.Header.Get("Sec-WebSocket-Extensions")}
}

// sendCompressed sends p as one compressed message (RFC 7692 7.2.1), in
// one frame.
func (d *deflateConn) sendCompressed(t *testing.T, p []byte) { d.sendFragments(t, p, 1) }

// sendFragments sends p as one compressed message in n frames, with a
// ping between the first two (control frames may come between).
func (d *deflateConn) sendFragments(t *testing.T, p []byte, n int) {
	t.Helper()
	var b bytes.Buffer
	fw, _ := flate.NewWriter(&b, flate.BestSpeed)
	if _, err := fw.Write(p); err != nil {
		t.Fatal(err)
	}
	if err := fw.Flush(); err != nil {
		t.Fatal(err)
	}
	c := bytes.TrimSuffix(b.Bytes(), []byte{0, 0, 0xff, 0xff})
	for i := 0; i < n; i++ {
		op := ws.OpBinary
		if i > 0 {
			op = ws.OpContinuation
		}
		f := ws.NewFrame(op, i == n-1, bytes.Clone(c[len(c)*i/n:len(c)*(i+1)/n]))
		if i == 0 {
			f.Header.Rsv = ws.Rsv(true, false, false)
		}
		if err := ws.WriteFrame(d.conn, ws.MaskFrameInPlace(f)); err != nil {
			t.Fatal(err)
		}
		if i == 0 && n > 1 {
			if err := ws.WriteFrame(d.conn, ws.MaskFrameInPlace(ws.NewPingFrame([]byte("p")))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// next returns the next binary message, inflated if it came compressed.
func (d *deflateConn) next() ([]byte, error) {
	_ = d.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := ws.ReadFrame(d.br)
		if err != nil {
			return nil, err
		}
		switch f.Header.OpCode {
		case ws.OpClose:
			return nil, fmt.Errorf("closed: %q", f.Payload)
		case ws.OpBinary:
		default:
			continue
		}
		d.wire += len(f.Payload)
		if f.Header.Rsv&0x4 == 0 {
			return f.Payload, nil
		}
		d.rsv1++
		dict := d.history
		if strings.Contains(d.accepted, "server_no_context_takeover") {
			dict = nil
		}
		src := append(f.Payload, 0, 0, 0xff, 0xff, 1, 0, 0, 0xff, 0xff)
		out, err := io.ReadAll(flate.NewReaderDict(bytes.NewReader(src), dict))
		if err != nil {
			return nil, fmt.Errorf("inflating a message of %d bytes: %w", len(f.Payload), err)
		}
		d.history = append(d.history, out...)
		if len(d.history) > 32<<10 {
			d.history = d.history[len(d.history)-32<<10:]
		}
		return out, nil
	}
}

// TestBrowserDeflate: with each setting of gateway.browser_compression, a
// browser offering permessage-deflate as Chromium does gets the answer the
// setting calls for; its compressed messages reach the host as they were
// before compression, and what the host sends reaches it whole and, with
// compression on, compressed: fewer bytes to the browser than from the
// host, as the admin API's bytes_to_client says too.
func TestBrowserDeflate(t *testing.T) {
	for _, tc := range []struct {
		mode, accept string
	}{
		{config.BrowserCompressionContext, "permessage-deflate;client_no_context_takeover"},
		{config.BrowserCompressionMessage, "permessage-deflate;server_no_context_takeover;client_no_context_takeover"},
		{config.BrowserCompressionOff, ""},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			h, host, _ := browserHarness(t, x224.ProtocolSSL, func(c *config.Config) { c.Gateway.BrowserCompression = tc.mode })
			dest := fmt.Sprintf("127.0.0.1:%d", host.port)
			b := openDeflate(t, h, chromiumOffer)
			if strings.ReplaceAll(b.accepted, " ", "") != tc.accept {
				t.Fatalf("Sec-WebSocket-Extensions %q, want %q", b.accepted, tc.accept)
			}
			send := b.send
			if tc.accept != "" {
				send = b.sendCompressed
			}
			send(t, request(h.token(t, "alice", "127.0.0.1", host.port, time.Minute), dest))
			msg, err := b.next()
			if err != nil {
				t.Fatalf("no answer: %v\n%s", err, h.logs.String())
			}
			if resp, err := rdcleanpath.Decode(msg); err != nil || resp.Error != nil {
				t.Fatalf("answer %+v, %v\n%s", resp, err, h.logs.String())
			}
			send(t, clientInfo(0x133))
			select {
			case got := <-host.got:
				if want := clientInfo(0x13b); !bytes.Equal(got, want) {
					t.Fatalf("the host got %x, want %x", got, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("the host got nothing\n%s", h.logs.String())
			}
			if echo, err := b.next(); err != nil || !bytes.Equal(echo, clientInfo(0x13b)) {
				t.Fatalf("echo %x, %v", echo, err)
			}
			// Screen-like output, the same rows again and again: the host
			// echoes it, in TLS records of its own sizes. The second round
			// goes up as a compressed message in three frames.
			row := []byte("the quick brown fox jumps over the lazy dog 0123456789 ")
			for i := 0; i < 3; i++ {
				tail := append([]byte{0x44, 0x0a}, bytes.Repeat(row, 200)...)
				if i == 1 && tc.accept != "" {
					b.sendFragments(t, tail, 3)
				} else {
					send(t, tail)
				}
				var back []byte
				for len(back) < len(tail) {
					m, err := b.next()
					if err != nil {
						t.Fatal(err)
					}
					back = append(back, m...)
				}
				if !bytes.Equal(back, tail) {
					t.Fatalf("round %d: what the host sent reached the browser changed", i)
				}
			}
			var ti *struct{ down, toClient uint64 }
			for _, x := range h.srv.Tunnels() {
				if x.Transport == "browser" && x.Open {
					ti = &struct{ down, toClient uint64 }{x.BytesDown, x.BytesToClient}
				}
			}
			if ti == nil {
				t.Fatalf("no open browser session: %+v", h.srv.Tunnels())
			}
			t.Logf("%s: host sent %d bytes, the browser got %d in %d messages compressed (admin API: %d)", tc.mode, ti.down, b.wire, b.rsv1, ti.toClient)
			if ti.toClient != uint64(b.wire) {
				t.Errorf("bytes_to_client %d, the browser got %d", ti.toClient, b.wire)
			}
			if tc.accept == "" {
				if b.rsv1 != 0 || ti.toClient < ti.down {
					t.Errorf("compression off, yet %d messages came compressed, %d bytes of %d", b.rsv1, ti.toClient, ti.down)
				}
				return
			}
			if b.rsv1 == 0 || ti.toClient*4 > ti.down {
				t.Errorf("%d messages compressed: %d bytes to the browser for %d from the host", b.rsv1, ti.toClient, ti.down)
			}
		})
	}
}

// TestBrowserCompressedBitRefused: a client that sets the compressed bit
// without having negotiated permessage-deflate is cut off, and the host
// gets nothing of it.
func TestBrowserCompressedBitRefused(t *testing.T) {
	h, host, _ := browserHarness(t, x224.ProtocolSSL, func(c *config.Config) { c.Gateway.BrowserCompression = config.BrowserCompressionOff })
	b := openDeflate(t, h, chromiumOffer)
	if b.accepted != "" {
		t.Fatalf("Sec-WebSocket-Extensions %q with compression off", b.accepted)
	}
	b.sendCompressed(t, request(h.token(t, "alice", "127.0.0.1", host.port, time.Minute), fmt.Sprintf("127.0.0.1:%d", host.port)))
	for {
		msg, err := b.next()
		if err != nil {
			break
		}
		if resp, derr := rdcleanpath.Decode(msg); derr != nil || resp.Error == nil {
			t.Fatalf("answered %+v (%v) to a compressed message nobody negotiated", resp, derr)
		}
	}
	if n := host.accepted.Load(); n != 0 {
		t.Fatalf("the host was reached %d times", n)
	}
}
