// Package echo is the bench's stand-in for an RDP host (the paper's
// TSGSServer): for every request it reads it answers with a configured
// number of packets of a configured size, or streams bulk data. Each
// connection states what it wants in an 8-byte hello, so one server serves
// every scenario.
package echo

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
)

// Modes a hello can ask for.
const (
	ModeEcho = 1 // read Up bytes, answer Count packets of Down bytes, repeat
	ModeBulk = 2 // stream data to the client until it hangs up
	ModeSink = 3 // read and discard everything the client sends
)

// HelloLen is the size of the hello that opens every connection.
const HelloLen = 8

// Hello is what a connection asks of the server.
type Hello struct {
	Mode     uint8
	Count    uint8
	Up, Down uint16
}

// Append encodes h: 'D' 'W' mode count up(LE16) down(LE16).
func (h Hello) Append(b []byte) []byte {
	b = append(b, 'D', 'W', h.Mode, h.Count)
	b = binary.LittleEndian.AppendUint16(b, h.Up)
	return binary.LittleEndian.AppendUint16(b, h.Down)
}

// ParseHello decodes and checks a hello.
func ParseHello(b []byte) (Hello, error) {
	if len(b) < HelloLen || b[0] != 'D' || b[1] != 'W' {
		return Hello{}, errors.New("echo: bad hello")
	}
	h := Hello{Mode: b[2], Count: b[3], Up: binary.LittleEndian.Uint16(b[4:]), Down: binary.LittleEndian.Uint16(b[6:])}
	switch {
	case h.Mode == ModeEcho && (h.Up == 0 || h.Count == 0):
		return h, errors.New("echo: echo mode needs up > 0 and count > 0")
	case h.Mode < ModeEcho || h.Mode > ModeSink:
		return h, fmt.Errorf("echo: unknown mode %d", h.Mode)
	}
	return h, nil
}

// Server accepts connections on one or more listeners.
type Server struct {
	Log *slog.Logger
	wg  sync.WaitGroup
}

// Serve accepts on ln until ctx ends; tc, when set, wraps connections in TLS
// (the direct baseline uses the same TLS as the gateway).
func (s *Server) Serve(ctx context.Context, ln net.Listener, tc *tls.Config) error {
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	go func() { <-ctx.Done(); ln.Close() }()
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		s.wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("echo: accept: %w", err)
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { mu.Lock(); delete(conns, c); mu.Unlock(); c.Close() }()
			if err := serveConn(c); err != nil && !errors.Is(err, io.EOF) && s.Log != nil {
				s.Log.Debug("echo connection ended", "err", err)
			}
		}()
	}
}

func serveConn(c net.Conn) error {
	var hb [HelloLen]byte
	if _, err := io.ReadFull(c, hb[:]); err != nil {
		return err
	}
	h, err := ParseHello(hb[:])
	if err != nil {
		return err
	}
	switch h.Mode {
	case ModeBulk:
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
	case ModeSink:
		_, err := io.Copy(io.Discard, c)
		return err
	}
	in := make([]byte, h.Up)
	out := make([]byte, h.Down)
	for {
		if _, err := io.ReadFull(c, in); err != nil {
			return err
		}
		// The answer repeats the request, so the client can tell that
		// what came back is what it sent, through whatever relayed it.
		for i := range out {
			out[i] = in[i%len(in)]
		}
		for i := 0; i < int(h.Count); i++ {
			if _, err := c.Write(out); err != nil {
				return err
			}
		}
	}
}
