// Package latency is a TCP proxy that delays every byte by a fixed time in
// each direction: a WAN between a broker and its database on loopback,
// since kernel netem is not available everywhere. Delay is applied per
// chunk read, on its own schedule, so a delayed stream keeps its
// throughput: a round trip through the proxy costs 2×OneWay, not more.
package latency

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from a listener to Target.
type Proxy struct {
	Target string
	// OneWay is added to each direction; the round trip grows by twice it.
	OneWay time.Duration
	Log    *slog.Logger

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// Serve accepts on ln until ctx ends, then closes every proxied connection.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	p.mu.Lock()
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	go func() { <-ctx.Done(); ln.Close() }()
	var wg sync.WaitGroup
	defer func() {
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); p.handle(c) }()
	}
}

func (p *Proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *Proxy) handle(client net.Conn) {
	p.track(client, true)
	defer p.track(client, false)
	defer client.Close()
	server, err := net.DialTimeout("tcp", p.Target, 10*time.Second)
	if err != nil {
		if p.Log != nil {
			p.Log.Debug("latency proxy: dial", "target", p.Target, "error", err)
		}
		return
	}
	p.track(server, true)
	defer p.track(server, false)
	defer server.Close()
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, client); done <- struct{}{} }()
	go func() { p.pipe(client, server); done <- struct{}{} }()
	<-done
	<-done
}

type chunk struct {
	due time.Time
	b   []byte
}

// pipe copies src to dst, each chunk written OneWay after it was read.
func (p *Proxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{time.Now().Add(p.OneWay), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			src.Close()
			for range q {
			}
			return
		}
	}
	// src ended: pass the end on so the peer sees it too.
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	} else {
		dst.Close()
	}
}
