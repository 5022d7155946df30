// Package tsgclient is the client side of the MS-TSGU HTTP transport: it
// opens a tunnel through an RD Gateway (deskway's or any other) over a
// websocket or the legacy RDG_IN_DATA/RDG_OUT_DATA pair, and returns a
// net.Conn-like stream to the RDP host behind it. Tests and the capacity
// bench drive gateways with it.
package tsgclient

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

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
