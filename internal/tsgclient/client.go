// Package tsgclient is the client side of the MS-TSGU HTTP transport: it
// opens a tunnel through an RD Gateway (deskway's or any other) over a
// websocket or the legacy RDG_IN_DATA/RDG_OUT_DATA pair, and returns a
// net.Conn-like stream to the RDP host behind it. Tests and the capacity
// bench drive gateways with it.
package tsgclient

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/Azure/go-ntlmssp"
	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/proto/tsgu"
)

// Transports.
const (
	Websocket = "websocket"
	Legacy    = "legacy"
)

// Config says how to reach and authenticate to the gateway.
type Config struct {
	// Gateway is host:port.
	Gateway string
	TLS     *tls.Config
	// User and Password log in with NTLM over HTTP; Token uses PAA instead.
	User, Password string
	Token          string
	// Transport is Websocket (default) or Legacy.
	Transport  string
	ClientName string
	// Dial opens the TCP connection; nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// StatusError is a refusal the gateway sent in a response packet.
type StatusError struct {
	Packet tsgu.PacketType
	Code   tsgu.HRESULT
}

// Error gives the packet the gateway refused in and its HRESULT.
func (e *StatusError) Error() string {
	return fmt.Sprintf("tsgclient: gateway refused in %s: %s", e.Packet, e.Code)
}

// HTTPError is a refusal at the HTTP layer.
type HTTPError struct {
	Method string
	Status int
}

// Error gives the request method and the HTTP status the gateway answered.
func (e *HTTPError) Error() string {
	return fmt.Sprintf("tsgclient: %s answered HTTP %d", e.Method, e.Status)
}

// Conn is an open channel through the gateway. Read returns bytes from the
// host, Write sends bytes to it. Reads and writes may run concurrently.
type Conn struct {
	r       *packetStream
	w       packetSink
	closers []io.Closer

	dataLeft int // payload bytes of the current data packet not yet read
	wmu      sync.Mutex
	wbuf     []byte

	// ConsentMessage and ServiceMessage are what the gateway showed, if anything.
	ConsentMessage string
	ServiceMessage string
	TunnelID       uint32
	// CloseStatus is the status of the gateway's CLOSE_CHANNEL, once Read
	// has returned io.EOF because of one.
	CloseStatus tsgu.HRESULT
}

type packetSink interface{ send(p []byte) error }

// Dial opens a tunnel and a channel to host:port.
func Dial(ctx context.Context, cfg Config, host string, port uint16) (*Conn, error) {
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: 10 * time.Second}
		cfg.Dial = d.DialContext
	}
	if cfg.ClientName == "" {
		cfg.ClientName = "deskway-client"
	}
	var c *Conn
	var err error
	if cfg.Transport == Legacy {
		c, err = dialLegacy(ctx, cfg)
	} else {
		c, err = dialWebsocket(ctx, cfg)
	}
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.setDeadline(dl)
	}
	if err := c.handshake(cfg, host, port); err != nil {
		c.Close()
		return nil, err
	}
	c.setDeadline(time.Time{})
	return c, nil
}

func (c *Conn) setDeadline(t time.Time) {
	for _, x := range c.closers {
		if d, ok := x.(interface{ SetDeadline(time.Time) error }); ok {
			_ = d.SetDeadline(t)
		}
	}
}

func (c *Conn) sendMsg(m tsgu.Message) error {
	b, err := m.Append(nil)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.send(b)
}

// recv returns the next control packet, skipping keepalives.
func (c *Conn) recv() (tsgu.Message, error) {
	for {
		p, err := c.r.next()
		if err != nil {
			return nil, err
		}
		m, err := tsgu.Decode(p)
		if err != nil {
			return nil, err
		}
		switch m := m.(type) {
		case *tsgu.Keepalive:
			continue
		case *tsgu.ServiceMessage:
			c.ServiceMessage = m.Message
			continue
		}
		return m, nil
	}
}

func expect[T tsgu.Message](c *Conn) (T, error) {
	var zero T
	m, err := c.recv()
	if err != nil {
		return zero, err
	}
	t, ok := m.(T)
	if !ok {
		return zero, fmt.Errorf("tsgclient: got %s, want %s", m.Type(), zero.Type())
	}
	return t, nil
}

func (c *Conn) handshake(cfg Config, host string, port uint16) error {
	ext := tsgu.ExtAuthNone
	if cfg.Token != "" {
		ext = tsgu.ExtAuthPAA
	}
	if err := c.sendMsg(&tsgu.HandshakeRequest{VerMajor: 1, ExtendedAuth: ext}); err != nil {
		return err
	}
	hr, err := expect[*tsgu.HandshakeResponse](c)
	if err != nil {
		return err
	}
	if hr.ErrorCode.Failed() {
		return &StatusError{hr.Type(), hr.ErrorCode}
	}
	tc := &tsgu.TunnelCreate{Capabilities: tsgu.CapQuarSOH | tsgu.CapMessagingConsentSign | tsgu.CapMessagingServiceMsg}
	if cfg.Token != "" {
		tc.SetCookieString(cfg.Token)
	}
	if err := c.sendMsg(tc); err != nil {
		return err
	}
	tr, err := expect[*tsgu.TunnelResponse](c)
	if err != nil {
		return err
	}
	if tr.StatusCode.Failed() {
		return &StatusError{tr.Type(), tr.StatusCode}
	}
	c.TunnelID, c.ConsentMessage = tr.TunnelID, tr.ConsentMsg
	if err := c.sendMsg(&tsgu.TunnelAuth{ClientName: cfg.ClientName}); err != nil {
		return err
	}
	ar, err := expect[*tsgu.TunnelAuthResponse](c)
	if err != nil {
		return err
	}
	if ar.ErrorCode.Failed() {
		return &StatusError{ar.Type(), ar.ErrorCode}
	}
	if err := c.sendMsg(&tsgu.ChannelCreate{Resources: []string{host}, Port: port, Protocol: tsgu.ProtocolRDP}); err != nil {
		return err
	}
	cr, err := expect[*tsgu.ChannelResponse](c)
	if err != nil {
		return err
	}
	if cr.ErrorCode.Failed() {
		return &StatusError{cr.Type(), cr.ErrorCode}
	}
	return nil
}

// Read returns payload bytes from the host. A close from the gateway is
// io.EOF. Payload is read from the stream straight into b, so a bulk
// transfer costs the client no copy beyond the one TLS makes.
func (c *Conn) Read(b []byte) (int, error) {
	for c.dataLeft == 0 {
		p, n, err := c.r.head()
		if err != nil {
			return 0, err
		}
		if p == nil {
			c.dataLeft = n
			continue
		}
		h, _ := tsgu.ParseHeader(p)
		switch h.Type {
		case tsgu.TypeKeepalive:
		case tsgu.TypeCloseChannel:
			var cc tsgu.CloseChannel
			if err := cc.Decode(p[tsgu.HeaderLen:]); err == nil {
				c.CloseStatus = cc.StatusCode
			}
			_ = c.sendMsg(&tsgu.CloseChannelResponse{})
			return 0, io.EOF
		case tsgu.TypeCloseChannelResponse:
			return 0, io.EOF
		default:
			m, err := tsgu.Decode(p)
			if err != nil {
				return 0, err
			}
			if sm, ok := m.(*tsgu.ServiceMessage); ok {
				c.ServiceMessage = sm.Message
			}
		}
	}
	n, err := c.r.readRaw(b[:min(len(b), c.dataLeft)])
	c.dataLeft -= n
	if err == io.EOF && c.dataLeft > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// Write sends b to the host in data packets of at most 64 KiB.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	done := 0
	for done < len(b) {
		n := min(len(b)-done, tsgu.MaxDataLen)
		var err error
		c.wbuf, err = tsgu.AppendData(c.wbuf[:0], b[done:done+n])
		if err != nil {
			return done, err
		}
		if err := c.w.send(c.wbuf); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// CloseChannel asks the gateway to close the channel, as clients do on logoff.
func (c *Conn) CloseChannel() error { return c.sendMsg(&tsgu.CloseChannel{}) }

// Close drops the connections to the gateway.
func (c *Conn) Close() error {
	var errs []error
	for _, x := range c.closers {
		errs = append(errs, x.Close())
	}
	return errors.Join(errs...)
}

// packetStream splits a byte stream into TSGU packets.
type packetStream struct {
	r   io.Reader
	buf []byte
	n   int
	off int
}

func (s *packetStream) next() ([]byte, error) {
	for {
		if p, n, err := tsgu.Split(s.buf[s.off:s.n]); err != nil {
			return nil, err
		} else if n > 0 {
			s.off += n
			return p, nil
		}
		if err := s.fill(); err != nil {
			return nil, err
		}
	}
}

// head is next for a reader of payload: a data packet's header is
// consumed and the length of its payload, still in the stream, returned
// (p == nil); any other packet is returned whole.
func (s *packetStream) head() (p []byte, dataLen int, err error) {
	for {
		buf := s.buf[s.off:s.n]
		if len(buf) >= tsgu.DataHeaderLen {
			h, err := tsgu.ParseHeader(buf)
			if err != nil {
				return nil, 0, err
			}
			if h.Type == tsgu.TypeData {
				n := int(binary.LittleEndian.Uint16(buf[tsgu.HeaderLen:]))
				if int(h.Length) != tsgu.DataHeaderLen+n {
					return nil, 0, fmt.Errorf("tsgclient: data packet of %d bytes carries %d of payload", h.Length, n)
				}
				s.off += tsgu.DataHeaderLen
				return nil, n, nil
			}
		}
		if p, n, err := tsgu.Split(buf); err != nil {
			return nil, 0, err
		} else if n > 0 {
			s.off += n
			return p, 0, nil
		}
		if err := s.fill(); err != nil {
			return nil, 0, err
		}
	}
}

// readRaw reads the stream's next bytes into b: what is buffered first,
// then straight from the source.
func (s *packetStream) readRaw(b []byte) (int, error) {
	if s.off < s.n {
		n := copy(b, s.buf[s.off:s.n])
		s.off += n
		return n, nil
	}
	return s.r.Read(b)
}

// fill reads more of the stream into buf, making room first.
func (s *packetStream) fill() error {
	if s.off > 0 {
		copy(s.buf, s.buf[s.off:s.n])
		s.n -= s.off
		s.off = 0
	}
	if s.n == len(s.buf) {
		nb := make([]byte, max(2*len(s.buf), 4096))
		copy(nb, s.buf[:s.n])
		s.buf = nb
	}
	m, err := s.r.Read(s.buf[s.n:])
	s.n += m
	if err != nil && m == 0 {
		return err
	}
	return nil
}

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
