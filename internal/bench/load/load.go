// Package load is the bench's client side (the paper's TSGSClient): it
// holds N tunnels open, each sending one request per interval with one
// request in flight, and times every round trip from before the send to
// the end of the answer.
package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/bench/echo"
)

// Dialer opens one stream to the echo server, through whatever is measured.
type Dialer func(ctx context.Context) (io.ReadWriteCloser, error)

// Pattern is the traffic of one tunnel.
type Pattern struct {
	Up, Down int
	Count    int
	Interval time.Duration
}

// Generator holds a growing set of tunnels with the same pattern.
type Generator struct {
	dial    Dialer
	pattern Pattern

	mu      sync.Mutex // guards tunnels
	tunnels []*tunnel
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	phase  atomic.Int64 // samples are kept only while phase > 0, tagged with it
	epoch  atomic.Int64 // source of unique phase numbers
	errors atomic.Int64
	// corrupt counts answers that did not repeat their request (each is
	// an error too).
	corrupt atomic.Int64
}

type tunnel struct {
	conn    io.ReadWriteCloser
	mu      sync.Mutex // guards samples
	samples []int32    // microseconds, for the current phase
	phase   int64
	dead    atomic.Bool
}

// New returns a generator; it opens nothing until Grow.
func New(dial Dialer, p Pattern) *Generator {
	ctx, cancel := context.WithCancel(context.Background())
	return &Generator{dial: dial, pattern: p, ctx: ctx, cancel: cancel}
}

// Len is the number of tunnels opened so far (alive or not).
func (g *Generator) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.tunnels)
}

// Alive is the number of tunnels still exchanging data.
func (g *Generator) Alive() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, t := range g.tunnels {
		if !t.dead.Load() {
			n++
		}
	}
	return n
}

// Errors counts failed round trips and lost tunnels.
func (g *Generator) Errors() int64 { return g.errors.Load() }

// Corrupt is how many answers did not repeat their request.
func (g *Generator) Corrupt() int64 { return g.corrupt.Load() }

// Grow opens tunnels until there are n, parallel at most par at a time.
func (g *Generator) Grow(ctx context.Context, n, par int) error {
	need := n - g.Len()
	if need <= 0 {
		return nil
	}
	sem := make(chan struct{}, par)
	var firstErr error
	var emu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < need; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := g.open(ctx); err != nil {
				emu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

func (g *Generator) open(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c, err := g.dial(dctx)
	if err != nil {
		return fmt.Errorf("load: open tunnel: %w", err)
	}
	p := g.pattern
	hello := echo.Hello{Mode: echo.ModeEcho, Count: uint8(p.Count), Up: uint16(p.Up), Down: uint16(p.Down)}.Append(nil)
	if _, err := c.Write(hello); err != nil {
		c.Close()
		return fmt.Errorf("load: hello: %w", err)
	}
	t := &tunnel{conn: c}
	g.mu.Lock()
	g.tunnels = append(g.tunnels, t)
	g.mu.Unlock()
	g.wg.Add(1)
	go g.run(t)
	return nil
}

// run is one tunnel's loop: send, wait for the whole answer, sleep to the next tick.
func (g *Generator) run(t *tunnel) {
	defer g.wg.Done()
	p := g.pattern
	req := make([]byte, p.Up)
	resp := make([]byte, p.Down*p.Count)
	var seq uint64
	// Spread the first sends over one interval so tunnels do not beat in step.
	next := time.Now().Add(time.Duration(randN(int64(p.Interval))))
	for g.ctx.Err() == nil {
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-g.ctx.Done():
				return
			}
		}
		// Each request is new (its count, then a byte pattern of it),
		// and every answer must repeat it: a relay that mixed up,
		// dropped or made up bytes counts as an error, not as speed.
		seq++
		for i := range req {
			req[i] = byte(seq>>(8*(i%8))) ^ byte(i)
		}
		start := time.Now()
		if _, err := t.conn.Write(req); err != nil {
			g.lose(t)
			return
		}
		if _, err := io.ReadFull(t.conn, resp); err != nil {
			g.lose(t)
			return
		}
		for i := range resp {
			if resp[i] != req[i%p.Down%len(req)] { // each packet repeats the request from its start
				g.corrupt.Add(1)
				g.lose(t)
				return
			}
		}
		rtt := time.Since(start)
		if ph := g.phase.Load(); ph > 0 {
			us := rtt.Microseconds()
			if us > math.MaxInt32 {
				us = math.MaxInt32
			}
			t.mu.Lock()
			if t.phase != ph {
				t.phase, t.samples = ph, t.samples[:0]
			}
			t.samples = append(t.samples, int32(us))
			t.mu.Unlock()
		}
		next = next.Add(p.Interval)
		if now := time.Now(); next.Before(now) {
			next = now
		}
	}
}

func (g *Generator) lose(t *tunnel) {
	if g.ctx.Err() == nil && t.dead.CompareAndSwap(false, true) {
		g.errors.Add(1)
	}
	t.conn.Close()
}

// Reopen replaces lost tunnels with new ones, at most par at a time.
func (g *Generator) Reopen(ctx context.Context, par int) error {
	g.mu.Lock()
	alive := g.tunnels[:0:0]
	for _, t := range g.tunnels {
		if !t.dead.Load() {
			alive = append(alive, t)
		}
	}
	want := len(g.tunnels)
	g.tunnels = alive
	g.mu.Unlock()
	return g.Grow(ctx, want, par)
}

// Stats summarizes one measurement window.
type Stats struct {
	Tunnels    int     `json:"tunnels"`
	RoundTrips int     `json:"round_trips"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	Maxms      float64 `json:"max_ms"`
	// Missing counts live tunnels that completed no round trip in the window:
	// a stalled tunnel must not vanish from the percentiles.
	Missing int `json:"missing"`
}

// Measure records round trips for d and returns their distribution.
func (g *Generator) Measure(ctx context.Context, d time.Duration) (Stats, error) {
	ph := g.epoch.Add(1)
	g.phase.Store(ph)
	select {
	case <-time.After(d):
	case <-ctx.Done():
		g.phase.Store(0)
		return Stats{}, ctx.Err()
	}
	g.phase.Store(0)
	var all []int32
	st := Stats{}
	g.mu.Lock()
	tunnels := slices.Clone(g.tunnels)
	g.mu.Unlock()
	for _, t := range tunnels {
		if t.dead.Load() {
			continue
		}
		st.Tunnels++
		t.mu.Lock()
		if t.phase == ph && len(t.samples) > 0 {
			all = append(all, t.samples...)
		} else {
			st.Missing++
		}
		t.mu.Unlock()
	}
	if len(all) == 0 {
		return st, errors.New("load: no round trip completed in the window")
	}
	slices.Sort(all)
	q := func(f float64) float64 {
		i := int(math.Ceil(f*float64(len(all)))) - 1
		return float64(all[max(i, 0)]) / 1000
	}
	st.RoundTrips, st.P50ms, st.P99ms, st.Maxms = len(all), q(0.50), q(0.99), float64(all[len(all)-1])/1000
	if st.Missing > 0 {
		// A tunnel that answered nothing in the whole window waited at least that long.
		st.Maxms = math.Max(st.Maxms, float64(d.Milliseconds()))
	}
	return st, nil
}

// Close stops every tunnel.
func (g *Generator) Close() {
	g.cancel()
	g.mu.Lock()
	for _, t := range g.tunnels {
		t.conn.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

var seed atomic.Uint64

// randN is a cheap spread for start offsets (no need for crypto or global rand state).
func randN(n int64) int64 {
	if n <= 0 {
		return 0
	}
	x := seed.Add(0x9E3779B97F4A7C15)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return int64(x % uint64(n))
}

// NetDialer adapts a net dial function to a Dialer.
func NetDialer(f func(ctx context.Context) (net.Conn, error)) Dialer {
	return func(ctx context.Context) (io.ReadWriteCloser, error) { return f(ctx) }
}
