package sitebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/bench/procstat"
)

// receiverAddr is the hosted desktop's, where the receiver listens.
const receiverAddr = "10.0.0.10:5201"

// receiver is the desktop's end of the bench's connections: it counts
// each connection's bytes apart, by its order of arrival, and keeps the
// error that ended it, if any; the throughput reads their sum.
type receiver struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	bytes []*atomic.Int64
	errs  []error
	conns []net.Conn
}

// listen starts the receiver in the rig's desktop namespace.
func listen(r *rig) (*receiver, error) {
	var ln net.Listener
	if err := inNS(r.desk, func() error {
		var err error
		ln, err = net.Listen("tcp4", receiverAddr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	return receive(ln), nil
}

// receive counts the bytes of every connection ln accepts.
func receive(ln net.Listener) *receiver {
	rc := &receiver{ln: ln}
	rc.wg.Add(1)
	go func() {
		defer rc.wg.Done()
		for {
			c, err := rc.ln.Accept()
			if err != nil {
				return
			}
			rc.mu.Lock()
			i := len(rc.bytes)
			n := &atomic.Int64{}
			rc.bytes, rc.errs = append(rc.bytes, n), append(rc.errs, nil)
			rc.conns = append(rc.conns, c)
			rc.mu.Unlock()
			rc.wg.Add(1)
			go func() {
				defer rc.wg.Done()
				defer c.Close()
				buf := make([]byte, 256<<10)
				for {
					k, err := c.Read(buf)
					n.Add(int64(k))
					if err != nil {
						if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
							rc.mu.Lock()
							rc.errs[i] = err
							rc.mu.Unlock()
						}
						return
					}
				}
			}()
		}
	}()
	return rc
}

// total is the bytes of every connection so far.
func (rc *receiver) total() int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var sum int64
	for _, b := range rc.bytes {
		sum += b.Load()
	}
	return sum
}

// close stops the receiver and ends its connections: a sender whose
// tunnel was torn down mid-measurement (the bench interrupted) never
// closes its end, and a read would wait for it forever.
func (rc *receiver) close() {
	rc.ln.Close()
	rc.mu.Lock()
	for _, c := range rc.conns {
		c.Close()
	}
	rc.mu.Unlock()
	rc.wg.Wait()
}

// dial opens a TCP connection from the office's host (192.168.1.10) to
// the receiver.
func dial(ctx context.Context, r *rig) (net.Conn, error) {
	var c net.Conn
	err := inNS(r.lan, func() error {
		d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(192, 168, 1, 10)}}
		var err error
		c, err = d.DialContext(ctx, "tcp4", receiverAddr)
		return err
	})
	return c, err
}

// reachable waits until the office's host reaches the receiver (a
// WireGuard tunnel's first handshake, a neighbour's resolution).
func reachable(ctx context.Context, r *rig, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := dial(ctx, r)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the office does not reach the desktop within %s: %w", limit, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sample is one point measured: Gbit/s at the receiver, the whole
// machine's busy cores and the gateway process's cores over the window.
type sample struct {
	gbps, machineCores, gatewayCores float64
	// slowest is the least any one connection delivered, in Gbit/s.
	slowest float64
	// retransPct is the share of the sender's TCP segments sent again
	// in the window: a tunnel that drops shows here.
	retransPct float64
}

// measure runs conns connections from the office's host to the
// receiver, lets them ramp up for warmup, then counts the bytes the
// receiver gets for window. gatewayPID is 0 for a gateway that is no
// process (the kernel's paths).
func measure(ctx context.Context, r *rig, rc *receiver, conns int, warmup, window time.Duration, gatewayPID int) (sample, error) {
	var cs []net.Conn
	stop := func() {
		for _, c := range cs {
			c.Close()
		}
	}
	defer stop()
	for range conns {
		c, err := dial(ctx, r)
		if err != nil {
			return sample{}, fmt.Errorf("connect: %w", err)
		}
		cs = append(cs, c)
	}
	sent := make([]atomic.Int64, conns)
	var senders sync.WaitGroup
	var sendErr atomic.Value
	var stopping atomic.Bool
	for i, c := range cs {
		senders.Add(1)
		go func() {
			defer senders.Done()
			buf := make([]byte, 256<<10)
			for {
				n, err := c.Write(buf)
				sent[i].Add(int64(n))
				if err != nil {
					if !stopping.Load() && !errors.Is(err, net.ErrClosed) {
						sendErr.Store(err)
					}
					return
				}
			}
		}()
	}
	if err := sleep(ctx, warmup); err != nil {
		return sample{}, err
	}
	b0, m0, g0, t0s := rc.total(), machineCPU(), gatewayCPU(gatewayPID), tcpCounters(r.lan)
	s0 := make([]int64, conns)
	for i := range sent {
		s0[i] = sent[i].Load()
	}
	t0 := time.Now()
	if err := sleep(ctx, window); err != nil {
		return sample{}, err
	}
	b1, m1, g1, t1s := rc.total(), machineCPU(), gatewayCPU(gatewayPID), tcpCounters(r.lan)
	wall := time.Since(t0).Seconds()
	slowest := -1.0
	for i := range sent {
		// Sent, not received: the receiver does not tell connections
		// apart, and what one connection sent in a window of seconds
		// is what it got through, less a socket buffer.
		g := float64(sent[i].Load()-s0[i]) * 8 / wall / 1e9
		if slowest < 0 || g < slowest {
			slowest = g
		}
	}
	stopping.Store(true)
	stop()
	senders.Wait()
	if err, ok := sendErr.Load().(error); ok {
		return sample{}, fmt.Errorf("send: %w", err)
	}
	s := sample{gbps: float64(b1-b0) * 8 / wall / 1e9, slowest: slowest}
	if out := t1s.out - t0s.out; out > 0 {
		s.retransPct = 100 * float64(t1s.retrans-t0s.retrans) / float64(out)
	}
	if m0.total > 0 && m1.total > m0.total {
		s.machineCores = float64(m1.busy-m0.busy) / float64(m1.total-m0.total) * float64(m1.cpus)
	}
	if gatewayPID > 0 {
		s.gatewayCores = (g1 - g0).Seconds() / wall
	}
	if b1 == b0 {
		return s, errors.New("the receiver got nothing in the window")
	}
	return s, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// tcpStats are a namespace's TCP segments sent and sent again.
type tcpStats struct{ out, retrans int64 }

// tcpCounters reads namespace ns's TCP counters (/proc/net/snmp as a
// thread in ns sees it); zero if they cannot be read.
func tcpCounters(ns string) tcpStats {
	var st tcpStats
	_ = inNS(ns, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var head []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "Tcp:" {
				continue
			}
			if head == nil {
				head = f
				continue
			}
			for i := 1; i < len(f) && i < len(head); i++ {
				n, _ := strconv.ParseInt(f[i], 10, 64)
				switch head[i] {
				case "OutSegs":
					st.out = n
				case "RetransSegs":
					st.retrans = n
				}
			}
		}
		return nil
	})
	return st
}

// cpuTimes is /proc/stat's first line: every CPU's time, in ticks.
type cpuTimes struct {
	busy, total int64
	cpus        int
}

// machineCPU reads the whole machine's CPU time. Busy is everything but
// idle and iowait: user, system, and the interrupts and softirqs in
// which the kernel forwards, encapsulates and delivers packets, which
// belong to no process.
func machineCPU() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	var t cpuTimes
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if i == 0 && f[0] == "cpu" {
			for j, v := range f[1:] {
				n, _ := strconv.ParseInt(v, 10, 64)
				// Fields 9 and 10 (guest, guest_nice) are already in user.
				if j >= 8 {
					break
				}
				t.total += n
				if j != 3 && j != 4 { // idle, iowait
					t.busy += n
				}
			}
		} else if strings.HasPrefix(f[0], "cpu") {
			t.cpus++
		}
	}
	return t
}

// gatewayCPU is the gateway process's CPU time so far, from the
// scheduler's per-thread counters.
func gatewayCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	d, _ := procstat.ThreadsCPU(pid)
	return d
}
