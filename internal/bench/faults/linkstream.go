package faults

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/nbdroot"
)

// LinkStream is the link between network-booted machines and their
// stream server cut while they read and write their disks, once for less
// than the time a request may go unanswered before the machine's kernel
// drops the connection, once for more. Each machine is a client that
// does what the kernel's NBD driver does with deskway-nbdroot: requests
// pipelined on one connection; one unanswered for nbdRequestTimeout
// ends the connection, and every request waiting is held and sent again
// on the connection deskway-nbdroot negotiates anew (nbdroot.Connect,
// the function it reconnects with); an I/O error reaches the machine
// only when no connection comes back within nbdDeadConnTimeout, or the
// server answers with one.
func LinkStream() Scenario { return Scenario{Name: "link-stream", Run: runLinkStream} }

// The kernel timeouts deskway-nbdroot sets on a root disk
// (internal/nbdroot).
const (
	nbdRequestTimeout  = 15 * time.Second
	nbdDeadConnTimeout = 5 * time.Minute
)

// linkStreamBlocks is how many 64 KiB blocks each queue slot of a
// machine writes in turn.
const linkStreamBlocks = 16

func runLinkStream(ctx context.Context, env Env, run int) ([]Outcome, error) {
	machines, depth := 4, 4
	if env.Small {
		machines, depth = 2, 2
	}
	var outs []Outcome
	for i, cut := range []time.Duration{8 * time.Second, 25 * time.Second} {
		dir := filepath.Join(env.Work, fmt.Sprintf("link-stream-%d", i))
		o, err := linkStreamRun(ctx, env, dir, cut, machines, depth)
		if err != nil {
			return nil, fmt.Errorf("faults: link-stream, %s cut, run %d: %w", cut, run, err)
		}
		outs = append(outs, o)
	}
	return outs, nil
}

// nbdMachine is one machine's disk: its connection, replaced as the
// kernel and deskway-nbdroot replace it.
type nbdMachine struct {
	id     int
	params nbdroot.Params

	mu         sync.Mutex
	conn       *nbdclient.Client
	gen        int
	reconnects int
	gaveUp     error
	// Results, under mu.
	acked   int
	ioErrs  int
	wrong   int           // reads that returned other bytes than the last acknowledged write
	longest time.Duration // the longest request, from first sending to its answer
	// lastOK is when a request was last answered (Unix ns).
	lastOK time.Time
}

func (m *nbdMachine) current() (*nbdclient.Client, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.conn, m.gen, m.gaveUp
}

// replace drops the connection of generation gen and negotiates the
// export again, for as long as the kernel would hold the requests.
func (m *nbdMachine) replace(ctx context.Context, gen int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || m.gaveUp != nil {
		return
	}
	m.conn.Drop()
	cctx, cancel := context.WithTimeout(ctx, nbdDeadConnTimeout)
	defer cancel()
	conn, ex, _, err := nbdroot.Connect(cctx, m.params, 0, func(string, ...any) {})
	if err != nil {
		m.gaveUp = fmt.Errorf("machine %d: no connection came back: %w", m.id, err)
		return
	}
	m.conn = nbdclient.New(conn, ex)
	m.gen++
	m.reconnects++
}

// do runs one request until it is answered: a request unanswered for
// nbdRequestTimeout ends its connection and is sent again on the next.
func (m *nbdMachine) do(ctx context.Context, f func(*nbdclient.Client) error) error {
	start := time.Now()
	for {
		c, gen, err := m.current()
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() { done <- f(c) }()
		timer := time.NewTimer(nbdRequestTimeout)
		select {
		case err = <-done:
			timer.Stop()
		case <-timer.C:
			err = errors.New("no answer within the request timeout")
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
		var se *nbdclient.ServerError
		switch {
		case err == nil:
			m.mu.Lock()
			m.longest = max(m.longest, time.Since(start))
			m.lastOK = time.Now()
			m.mu.Unlock()
			return nil
		case errors.As(err, &se):
			return fmt.Errorf("machine %d: I/O error: %w", m.id, err)
		}
		m.replace(ctx, gen)
	}
}

// slot is one queue slot of a machine: it writes its blocks in turn,
// each write naming its block and sequence number, and after each write
// reads back the block it wrote before, which must hold that write.
// It stops starting requests when stop ends; the one in flight is
// answered first, so every write it sent is acknowledged or failed.
func (m *nbdMachine) slot(ctx, stop context.Context, k, depth int, acked map[int]int, amu *sync.Mutex) {
	buf, rbuf, want := make([]byte, diskStreamBlock), make([]byte, diskStreamBlock), make([]byte, diskStreamBlock)
	prev := -1
	for seq := 1; stop.Err() == nil; seq++ {
		b := k + depth*(seq%linkStreamBlocks)
		fillBlock(buf, b, seq)
		err := m.do(ctx, func(c *nbdclient.Client) error { return c.WriteAt(buf, int64(b)*diskStreamBlock, false) })
		if err != nil {
			m.fail(ctx, err)
			return
		}
		amu.Lock()
		acked[b] = seq
		amu.Unlock()
		m.mu.Lock()
		m.acked++
		m.mu.Unlock()
		if prev >= 0 {
			amu.Lock()
			s := acked[prev]
			amu.Unlock()
			fillBlock(want, prev, s)
			if err := m.do(ctx, func(c *nbdclient.Client) error { _, err := c.ReadAt(rbuf, int64(prev)*diskStreamBlock); return err }); err != nil {
				m.fail(ctx, err)
				return
			}
			if !bytes.Equal(rbuf, want) {
				m.mu.Lock()
				m.wrong++
				m.mu.Unlock()
			}
		}
		prev = b
		if err := sleepCtx(stop, 10*time.Millisecond); err != nil {
			return
		}
	}
}

func (m *nbdMachine) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	m.ioErrs++
	m.mu.Unlock()
}

// linkStreamRun runs machines against one stream server through a fault
// proxy, cuts the link for cut, and checks every acknowledged write.
func linkStreamRun(ctx context.Context, env Env, dir string, cut time.Duration, machines, depth int) (Outcome, error) {
	o := Outcome{Case: fmt.Sprintf("stream client ↔ server link cut for %s (the client's request timeout %s)", cut, nbdRequestTimeout),
		Load:  fmt.Sprintf("%d machines, each with %d requests in flight writing 64 KiB blocks and reading back the one before, through one stream server", machines, depth),
		Users: machines}
	sdir := filepath.Join(dir, "server")
	if err := os.MkdirAll(sdir, 0o700); err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	base := filepath.Join(dir, "golden.img")
	if err := os.WriteFile(base, nil, 0o600); err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	if err := os.Truncate(base, 64<<20); err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	srv, err := newStreamServer(env.Bin, sdir, filepath.Join(dir, "store"), base, false)
	if err != nil {
		return o, err
	}
	defer srv.stop()
	proxy, err := newFaultProxy(srv.addr)
	if err != nil {
		return o, err
	}
	defer proxy.close()
	ms := make([]*nbdMachine, machines)
	acked := make([]map[int]int, machines)
	amus := make([]sync.Mutex, machines)
	for i := range ms {
		m := &nbdMachine{id: i + 1, params: nbdroot.Params{Export: fmt.Sprintf("golden/client%d/boot1", i+1), Servers: []string{proxy.Addr()}}}
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		conn, ex, _, err := nbdroot.Connect(dctx, m.params, 0, func(string, ...any) {})
		cancel()
		if err != nil {
			return o, fmt.Errorf("faults: machine %d: open the stream export: %w", i+1, err)
		}
		m.conn = nbdclient.New(conn, ex)
		ms[i], acked[i] = m, map[int]int{}
	}
	defer func() {
		for _, m := range ms {
			m.conn.Drop()
		}
	}()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i, m := range ms {
		for k := range depth {
			wg.Add(1)
			go func() { defer wg.Done(); m.slot(ctx, wctx, k, depth, acked[i], &amus[i]) }()
		}
	}
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return o, err
	}
	cutAt := time.Now()
	proxy.cut()
	if err := sleepCtx(ctx, cut); err != nil {
		return o, err
	}
	proxy.restore()
	back := time.Now()
	// Every machine is back once a request of its was answered after the
	// link returned.
	recover := -1.0
	for _, m := range ms {
		for deadline := back.Add(nbdDeadConnTimeout); ; {
			m.mu.Lock()
			ok, gave := m.lastOK.After(back), m.gaveUp != nil || m.ioErrs > 0
			at := m.lastOK
			m.mu.Unlock()
			if ok {
				recover = max(recover, at.Sub(cutAt).Seconds())
				break
			}
			if gave || time.Now().After(deadline) {
				break
			}
			if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
				return o, err
			}
		}
	}
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return o, err
	}
	stop()
	wg.Wait()
	// Every acknowledged write must read back, on the connection each
	// machine has now.
	lost, wrongDisks, ioErrs, reconnects, writes := 0, 0, 0, 0, 0
	var longest time.Duration
	var firstLost string
	rbuf, want := make([]byte, diskStreamBlock), make([]byte, diskStreamBlock)
	for i, m := range ms {
		for b, s := range acked[i] {
			fillBlock(want, b, s)
			err := m.do(ctx, func(c *nbdclient.Client) error { _, err := c.ReadAt(rbuf, int64(b)*diskStreamBlock); return err })
			if err != nil {
				m.ioErrs++
				break
			}
			if !bytes.Equal(rbuf, want) {
				lost++
				if firstLost == "" {
					firstLost = fmt.Sprintf("machine %d, block %d holds write %d of block %d, where write %d was acknowledged",
						m.id, b, binary.LittleEndian.Uint32(rbuf[4:]), binary.LittleEndian.Uint32(rbuf), s)
				}
			}
		}
		if m.wrong > 0 {
			wrongDisks++
		}
		ioErrs += m.ioErrs
		reconnects += m.reconnects
		writes += m.acked
		longest = max(longest, m.longest)
	}
	o.RecoverS = recover
	o.Affected = machines
	o.Metrics = map[string]float64{"writes_acked": float64(writes), "writes_lost": float64(lost), "wrong_disks": float64(wrongDisks),
		"io_errors": float64(ioErrs), "reconnects": float64(reconnects), "longest_request_s": seconds(longest),
		"cut_s": seconds(back.Sub(cutAt)), "request_timeout_s": nbdRequestTimeout.Seconds()}
	o.Held = lost == 0 && wrongDisks == 0 && ioErrs == 0 && recover > 0
	o.Notes = fmt.Sprintf("%d of %d machines answered again, the last %.1f s after the cut; %d connections replaced after a request went unanswered for %s; longest request %.1f s; %d writes acknowledged, %d of them not read back, %d machines read other bytes than they wrote, %d I/O errors",
		machines, machines, recover, reconnects, nbdRequestTimeout, longest.Seconds(), writes, lost, wrongDisks, ioErrs)
	if firstLost != "" {
		o.Notes += "; first lost: " + firstLost
	}
	if !o.Held {
		env.Log.Warn("stream server log (its end)", "log", tail(srv.log(), 4000))
	}
	return o, nil
}
