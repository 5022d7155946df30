package sessionhost

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// actionReport is one line a session's workload sent: an action's time, or
// that it failed, or (action "ready") that the workload started.
type actionReport struct {
	At     time.Time
	User   string
	Action string
	MS     float64
	Failed bool
}

// collector receives the workloads' reports on a loopback port. Lines
// must start with the run's token: the port is open to every local
// process, and a stray line must not count as a measurement.
type collector struct {
	ln    net.Listener
	token string
	log   *slog.Logger

	mu      sync.Mutex
	reports []actionReport
	ready   map[string]chan struct{}
	bad     int
}

func newCollector(token string, log *slog.Logger) (*collector, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sessionhost: the reports' listener: %w", err)
	}
	return &collector{ln: ln, token: token, log: log, ready: map[string]chan struct{}{}}, nil
}

// Addr is where workloads send their reports.
func (c *collector) Addr() string { return c.ln.Addr().String() }

// serve accepts reports until ctx ends.
func (c *collector) serve(ctx context.Context) {
	go func() { <-ctx.Done(); c.ln.Close() }()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			return
		}
		go c.read(conn)
	}
}

func (c *collector) read(conn net.Conn) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 512), 512)
	for sc.Scan() {
		r, err := parseReport(sc.Text(), c.token)
		c.mu.Lock()
		if err != nil {
			c.bad++
			c.mu.Unlock()
			c.log.Warn("a report the bench cannot use", "line", sc.Text(), "error", err)
			continue
		}
		r.At = time.Now()
		if r.Action == "ready" {
			if ch, ok := c.ready[r.User]; ok {
				select {
				case <-ch:
				default:
					close(ch)
				}
			}
		} else {
			c.reports = append(c.reports, r)
		}
		c.mu.Unlock()
	}
}

// parseReport reads "TOKEN USER ACTION MS" or "TOKEN USER ACTION failed".
func parseReport(line, token string) (actionReport, error) {
	f := strings.Fields(line)
	if len(f) != 4 {
		return actionReport{}, fmt.Errorf("%d fields, want 4", len(f))
	}
	if f[0] != token {
		return actionReport{}, fmt.Errorf("not this run's token")
	}
	r := actionReport{User: f[1], Action: f[2]}
	if f[3] == "failed" {
		r.Failed = true
		return r, nil
	}
	ms, err := strconv.ParseFloat(f[3], 64)
	if err != nil || ms < 0 {
		return actionReport{}, fmt.Errorf("time %q is not milliseconds", f[3])
	}
	r.MS = ms
	return r, nil
}

// expect returns a channel closed once user's workload reports it started.
func (c *collector) expect(user string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	c.ready[user] = ch
	return ch
}

// between returns the reports that arrived in [from, to).
func (c *collector) between(from, to time.Time) []actionReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []actionReport
	for _, r := range c.reports {
		if !r.At.Before(from) && r.At.Before(to) {
			out = append(out, r)
		}
	}
	return out
}
