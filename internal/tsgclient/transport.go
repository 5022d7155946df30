package tsgclient

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/Azure/go-ntlmssp"
	"github.com/gobwas/ws"
)

// httpExchange sends one request on conn and reads the response head.
func httpExchange(conn net.Conn, br *bufio.Reader, req *http.Request) (*http.Response, error) {
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("tsgclient: %s response: %w", req.Method, err)
	}
	return resp, nil
}

func newRequest(cfg Config, method, connID string) *http.Request {
	req, _ := http.NewRequest(method, "https://"+cfg.Gateway+"/remoteDesktopGateway/", nil)
	req.Header.Set("User-Agent", "MS-RDGateway/1.0")
	req.Header.Set("RDG-Connection-Id", connID)
	req.Header.Set("Cache-Control", "no-cache")
	if cfg.Token != "" {
		req.Header.Set("RDG-Auth-Scheme", "PAA")
	}
	return req
}

// openHTTP dials TLS and authenticates method, returning the final response
// and the connection it arrived on. decorate adds per-request headers.
func openHTTP(ctx context.Context, cfg Config, method, connID string, decorate func(*http.Request)) (net.Conn, *bufio.Reader, *http.Response, error) {
	raw, err := cfg.Dial(ctx, "tcp", cfg.Gateway)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("tsgclient: dial %s: %w", cfg.Gateway, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	tc := tls.Client(raw, cfg.TLS)
	br := bufio.NewReaderSize(tc, 8192)
	fail := func(err error) (net.Conn, *bufio.Reader, *http.Response, error) {
		tc.Close()
		return nil, nil, nil, err
	}
	req := newRequest(cfg, method, connID)
	decorate(req)
	if cfg.Token == "" {
		neg, _ := ntlmssp.NewNegotiateMessage("", "")
		req.Header.Set("Authorization", "NTLM "+base64.StdEncoding.EncodeToString(neg))
		resp, err := httpExchange(tc, br, req)
		if err != nil {
			return fail(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ch, ok := strings.CutPrefix(resp.Header.Get("WWW-Authenticate"), "NTLM ")
		if resp.StatusCode != http.StatusUnauthorized || !ok {
			return fail(&HTTPError{method, resp.StatusCode})
		}
		chb, err := base64.StdEncoding.DecodeString(ch)
		if err != nil {
			return fail(fmt.Errorf("tsgclient: challenge: %w", err))
		}
		am, err := ntlmssp.ProcessChallenge(chb, cfg.User, cfg.Password, false)
		if err != nil {
			return fail(fmt.Errorf("tsgclient: NTLM: %w", err))
		}
		req = newRequest(cfg, method, connID)
		decorate(req)
		req.Header.Set("Authorization", "NTLM "+base64.StdEncoding.EncodeToString(am))
	}
	resp, err := httpExchange(tc, br, req)
	if err != nil {
		return fail(err)
	}
	return tc, br, resp, nil
}

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("{%X-%X-%X-%X-%X}", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func dialWebsocket(ctx context.Context, cfg Config) (*Conn, error) {
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	conn, br, resp, err := openHTTP(ctx, cfg, "RDG_OUT_DATA", newID(), func(r *http.Request) {
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Version", "13")
		r.Header.Set("Sec-WebSocket-Key", base64.StdEncoding.EncodeToString(key))
	})
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		conn.Close()
		return nil, &HTTPError{"RDG_OUT_DATA", resp.StatusCode}
	}
	wc := &wsConn{conn: conn, br: br}
	return &Conn{r: &packetStream{r: wc}, w: wc, closers: []io.Closer{conn}}, nil
}

// wsConn is the client end of a websocket: masked writes, unmasked reads.
type wsConn struct {
	conn net.Conn
	br   *bufio.Reader
	left int64
	out  []byte
}

func (w *wsConn) Read(p []byte) (int, error) {
	for w.left == 0 {
		h, err := ws.ReadHeader(w.br)
		if err != nil {
			return 0, err
		}
		switch h.OpCode {
		case ws.OpClose:
			return 0, io.EOF
		case ws.OpPing, ws.OpPong:
			if _, err := io.CopyN(io.Discard, w.br, h.Length); err != nil {
				return 0, err
			}
		default:
			w.left = h.Length
		}
	}
	if int64(len(p)) > w.left {
		p = p[:w.left]
	}
	n, err := w.br.Read(p)
	w.left -= int64(n)
	return n, err
}

// send writes p as one masked binary frame; the caller serializes.
func (w *wsConn) send(p []byte) error {
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	h := ws.Header{Fin: true, OpCode: ws.OpBinary, Masked: true, Mask: mask, Length: int64(len(p))}
	var hb [14]byte
	hn := putClientHeader(hb[:], h)
	w.out = append(append(w.out[:0], hb[:hn]...), p...)
	ws.Cipher(w.out[hn:], mask, 0)
	_, err := w.conn.Write(w.out)
	return err
}

func putClientHeader(b []byte, h ws.Header) int {
	b[0] = 0x80 | byte(h.OpCode)
	n := 2
	switch l := h.Length; {
	case l < 126:
		b[1] = byte(l)
	case l <= 0xFFFF:
		b[1] = 126
		b[2], b[3] = byte(l>>8), byte(l)
		n = 4
	default:
		b[1] = 127
		for i := 0; i < 8; i++ {
			b[2+i] = byte(uint64(l) >> (56 - 8*i))
		}
		n = 10
	}
	b[1] |= 0x80
	copy(b[n:], h.Mask[:])
	return n + 4
}

func dialLegacy(ctx context.Context, cfg Config) (*Conn, error) {
	id := newID()
	noop := func(*http.Request) {}
	out, obr, resp, err := openHTTP(ctx, cfg, "RDG_OUT_DATA", id, noop)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		out.Close()
		return nil, &HTTPError{"RDG_OUT_DATA", resp.StatusCode}
	}
	// The 200 has no length: a 10-byte seed follows, then packets.
	if _, err := io.CopyN(io.Discard, obr, 10); err != nil {
		out.Close()
		return nil, fmt.Errorf("tsgclient: seed: %w", err)
	}
	in, _, resp, err := openHTTP(ctx, cfg, "RDG_IN_DATA", id, noop)
	if err != nil {
		out.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		out.Close()
		in.Close()
		return nil, &HTTPError{"RDG_IN_DATA", resp.StatusCode}
	}
	req := newRequest(cfg, "RDG_IN_DATA", id)
	req.Header.Set("Transfer-Encoding", "chunked")
	var head strings.Builder
	fmt.Fprintf(&head, "RDG_IN_DATA /remoteDesktopGateway/ HTTP/1.1\r\nHost: %s\r\n", cfg.Gateway)
	_ = req.Header.Write(&head)
	head.WriteString("\r\n")
	if _, err := io.WriteString(in, head.String()); err != nil {
		out.Close()
		in.Close()
		return nil, err
	}
	return &Conn{r: &packetStream{r: obr}, w: &chunkWriter{w: in}, closers: []io.Closer{in, out}}, nil
}

// chunkWriter writes each packet as one HTTP chunk, as mstsc and FreeRDP do.
type chunkWriter struct {
	w   io.Writer
	buf []byte
}

func (c *chunkWriter) send(p []byte) error {
	c.buf = fmt.Appendf(c.buf[:0], "%x\r\n", len(p))
	c.buf = append(append(c.buf, p...), '\r', '\n')
	_, err := c.w.Write(c.buf)
	return err
}

// OpenLegacyHalf authenticates one half of a legacy pair (RDG_OUT_DATA or
// RDG_IN_DATA) under connection id and returns the connection with the
// final response. For RDG_IN_DATA it then sends the chunked request that
// carries the tunnel, as xfreerdp does, and the response is nil unless the
// gateway answered it within a second (a refusal). Gateway tests use it to
// check pairing rules.
func OpenLegacyHalf(ctx context.Context, cfg Config, method, id string) (net.Conn, *http.Response, error) {
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: 10 * time.Second}
		cfg.Dial = d.DialContext
	}
	conn, br, resp, err := openHTTP(ctx, cfg, method, id, func(*http.Request) {})
	if err != nil || method != "RDG_IN_DATA" || resp.StatusCode != http.StatusOK {
		return conn, resp, err
	}
	req := newRequest(cfg, method, id)
	var head strings.Builder
	fmt.Fprintf(&head, "RDG_IN_DATA /remoteDesktopGateway/ HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n", cfg.Gateway)
	_ = req.Header.Write(&head)
	head.WriteString("\r\n")
	if _, err := io.WriteString(conn, head.String()); err != nil {
		conn.Close()
		return nil, nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	resp, err = http.ReadResponse(br, nil)
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		return conn, nil, nil // no answer: the gateway took the IN half
	}
	return conn, resp, nil
}
