package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// faultProxy relays TCP connections from a loopback port to a target and
// can cut the link: while cut it reads nothing from either side and
// forwards nothing, and opens no new connection to the target, so bytes
// wait in the senders' socket buffers as they would behind a firewall
// rule dropping every packet (no reset, no FIN reaches either side).
// When the link returns, what waited is delivered in order.
type faultProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	open  chan struct{} // closed while the link is up
	conns map[net.Conn]bool
	done  chan struct{}
	wg    sync.WaitGroup
}

// newFaultProxy listens on a free loopback port and relays to target.
func newFaultProxy(target string) (*faultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faults: fault proxy: %w", err)
	}
	p := &faultProxy{ln: ln, target: target, open: make(chan struct{}), conns: map[net.Conn]bool{}, done: make(chan struct{})}
	close(p.open)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is where clients of the target connect instead.
func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

// Port is Addr's port.
func (p *faultProxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// cut stops the link; restore brings it back.
func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

func (p *faultProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// wait blocks while the link is cut; false when the proxy closed.
func (p *faultProxy) wait() bool {
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	select {
	case <-open:
		return true
	case <-p.done:
		return false
	}
}

func (p *faultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		c.Close()
		return false
	default:
	}
	p.conns[c] = true
	return true
}

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

func (p *faultProxy) relay(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	if !p.wait() {
		return
	}
	var d net.Dialer
	t, err := d.DialContext(context.Background(), "tcp", p.target)
	if err != nil {
		return
	}
	defer t.Close()
	if !p.track(t) {
		return
	}
	ended := make(chan struct{}, 2)
	go func() { p.copy(t, c); ended <- struct{}{} }()
	go func() { p.copy(c, t); ended <- struct{}{} }()
	<-ended
	// One side ended: the other learns it once the link carries it.
	if p.wait() {
		c.Close()
		t.Close()
	}
	<-ended
}

// copy moves bytes from src to dst, reading and writing only while the
// link is up.
func (p *faultProxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		if !p.wait() {
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
			}
			return
		}
	}
}

// close ends the proxy and every connection it relays.
func (p *faultProxy) close() {
	p.mu.Lock()
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
