package sitebench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// Probe sends an ICMP echo request from the office's host
// (192.168.1.10) to the desktop (10.0.0.10) every 50 ms and records when
// each answer came, by when its request went: the failover scenario's,
// and the site e2e tests' too.
type Probe struct {
	c       *icmp.PacketConn
	stopc   chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	sent    map[int]time.Time
	answers []probeAnswer
}

type probeAnswer struct{ sent, got time.Time }

// probeID marks the bench's echo requests among the namespace's.
const probeID = 0x5e

// StartProbe starts probing from network namespace lan, which holds
// 192.168.1.10.
func StartProbe(lan string) (*Probe, error) {
	p := &Probe{sent: map[int]time.Time{}, stopc: make(chan struct{})}
	if err := inNS(lan, func() error {
		var err error
		p.c, err = icmp.ListenPacket("ip4:icmp", "192.168.1.10")
		return err
	}); err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		for seq := 1; ; seq++ {
			select {
			case <-p.stopc:
				return
			case <-tick.C:
			}
			s := seq & 0xffff
			p.mu.Lock()
			p.sent[s] = time.Now()
			p.mu.Unlock()
			m := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: probeID, Seq: s, Data: []byte("deskway-failover")}}
			b, _ := m.Marshal(nil)
			_, _ = p.c.WriteTo(b, &net.IPAddr{IP: net.IPv4(10, 0, 0, 10)})
		}
	}()
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 1500)
		for {
			n, _, err := p.c.ReadFrom(buf)
			if err != nil {
				return
			}
			got := time.Now()
			m, err := icmp.ParseMessage(1, buf[:n])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == probeID {
				p.mu.Lock()
				if at, ok := p.sent[e.Seq]; ok {
					p.answers = append(p.answers, probeAnswer{sent: at, got: got})
				}
				p.mu.Unlock()
			}
		}
	}()
	return p, nil
}

// AnswerAfter waits, up to limit, for the answer to a request sent
// after since, and returns when it came.
func (p *Probe) AnswerAfter(ctx context.Context, since time.Time, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	for {
		p.mu.Lock()
		for _, a := range p.answers {
			if a.sent.After(since) {
				p.mu.Unlock()
				return a.got, nil
			}
		}
		n := len(p.answers)
		p.mu.Unlock()
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no probe answered within %s (%d answers before)", limit, n)
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
}

// LongestGap is the longest time between two answers that came after
// since, or between since and the first.
func (p *Probe) LongestGap(since time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gap time.Duration
	last := since
	for _, a := range p.answers {
		if a.got.Before(since) {
			continue
		}
		gap = max(gap, a.got.Sub(last))
		last = a.got
	}
	return gap
}

// Close stops probing.
func (p *Probe) Close() {
	close(p.stopc)
	p.c.Close()
	p.wg.Wait()
}

// streams are TCP connections from the office's host to the desktop,
// each sending 32 KiB every 20 ms (13 Mbit/s): steady traffic across the
// kill that leaves the probes room.
type streams struct {
	conns    []net.Conn
	wg       sync.WaitGroup
	stopping atomic.Bool
	mu       sync.Mutex
	errs     []error
	once     sync.Once
}

func startStreams(ctx context.Context, r *rig, n int) (*streams, error) {
	s := &streams{errs: make([]error, n)}
	for range n {
		c, err := dial(ctx, r)
		if err != nil {
			s.stop()
			return nil, fmt.Errorf("connect: %w", err)
		}
		s.conns = append(s.conns, c)
	}
	for i, c := range s.conns {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			buf := make([]byte, 32<<10)
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for range tick.C {
				if _, err := c.Write(buf); err != nil {
					if !s.stopping.Load() || !errors.Is(err, net.ErrClosed) {
						s.mu.Lock()
						s.errs[i] = err
						s.mu.Unlock()
					}
					return
				}
			}
		}()
	}
	return s, nil
}

// stop closes every connection and returns the error that ended each
// before, if any.
func (s *streams) stop() []error {
	s.once.Do(func() {
		s.stopping.Store(true)
		for _, c := range s.conns {
			c.Close()
		}
		s.wg.Wait()
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}
