package gwbench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/bench/load"
	"github.com/deskway/deskway/internal/bench/report"
)

// farm runs kw1 o.Runs times through one gateway node alone, two nodes
// with clients rotating between them, and two nodes behind HAProxy (the
// farm as deploy/ ships it), in turn within each run; then kills one node
// under load and measures how many tunnels were lost and how long until
// all were open again. On one machine's shared cores more nodes add no
// capacity: what the runs show is what the farm path costs.
func (r *runner) farm(ctx context.Context) error {
	p := load.Pattern{Up: 90, Down: 90, Count: 1, Interval: 100 * time.Millisecond}
	direct, _, err := r.directRamp(ctx, p)
	if err != nil {
		return err
	}
	systems := []struct {
		key   string
		nodes int
		sys   system
	}{
		{"farm1", 1, r.farmSystem(1)},
		{"farm2", 2, r.farmSystem(2)},
		{"farm2_haproxy", 2, r.e.farmBehindHAProxy(2)},
	}
	got := map[string][]float64{}
	for run := 1; run <= r.o.Runs; run++ {
		for _, s := range systems {
			rp := r.runRamp(ctx, s.sys, p, 0, direct, run, 0)
			n, _ := r.addRamp("farm", rp, map[string]any{"nodes": s.nodes, "balancer": strings.HasSuffix(s.key, "haproxy")})
			if rp.err == nil || len(rp.steps) > 0 {
				got[s.key] = append(got[s.key], n)
			}
		}
	}
	for _, s := range systems {
		spread(r.res.Summary, s.key+"_kw1_max_tunnels_40ms", got[s.key], 0)
	}
	// Per run: two nodes behind HAProxy against one node alone.
	if a, b := got["farm2_haproxy"], got["farm1"]; len(a) == len(b) && len(a) > 0 {
		var rs []float64
		for i := range a {
			if b[i] > 0 {
				rs = append(rs, a[i]/b[i])
			}
		}
		if len(rs) > 0 {
			r.res.Summary["farm2_haproxy_ratio_1node_median"] = report.Round(median(rs), 2)
			r.res.Summary["farm2_haproxy_ratio_1node_worst"] = report.Round(slices.Min(rs), 2)
		}
	}
	return r.failover(ctx, p)
}

// farmSystem is nodes gateway processes behind client-side rotation.
func (r *runner) farmSystem(nodes int) system {
	return system{name: fmt.Sprintf("deskway-%dnode", nodes), start: func(int) (*proc, load.Dialer, string, error) {
		var procs []*proc
		var addrs []string
		for i := 0; i < nodes; i++ {
			p, a, err := r.e.startGateway(0)
			if err != nil {
				for _, q := range procs {
					q.stop()
				}
				return nil, nil, "", err
			}
			procs, addrs = append(procs, p), append(addrs, a)
		}
		var next atomic.Uint64
		d, err := r.e.gatewayDialer(func() string { return addrs[next.Add(1)%uint64(len(addrs))] })
		if err != nil {
			return nil, nil, "", err
		}
		// The first node is sampled; the others stop with it.
		first := procs[0]
		go func() {
			<-first.exited
			for _, q := range procs[1:] {
				q.stop()
			}
		}()
		return first, d, addrs[0], nil
	}}
}

// failover holds tunnels across two nodes, kills one, and lets clients
// reconnect through the rotation (a dead node's dial fails fast, the next
// address is tried), as mstsc does when a farm member disappears.
func (r *runner) failover(ctx context.Context, p load.Pattern) error {
	// 1,000 tunnels, or fewer when the ramp steps say the run is small.
	total := min(1000, r.o.Steps[len(r.o.Steps)-1])
	pa, a1, err := r.e.startGateway(0)
	if err != nil {
		return err
	}
	defer pa.stop()
	pb, a2, err := r.e.startGateway(0)
	if err != nil {
		return err
	}
	addrs := []string{a1, a2}
	var dead atomic.Bool
	var next atomic.Uint64
	d, err := r.e.gatewayDialer(func() string {
		a := addrs[next.Add(1)%2]
		if a == a2 && dead.Load() {
			a = a1
		}
		return a
	})
	if err != nil {
		return err
	}
	gen := load.New(d, p)
	defer gen.Close()
	if err := gen.Grow(ctx, total, 32); err != nil {
		return err
	}
	time.Sleep(r.o.Warmup)
	killed := time.Now()
	pb.kill()
	deadlineOK := false
	var lost int
	var recovered time.Duration
	for time.Since(killed) < 60*time.Second {
		time.Sleep(50 * time.Millisecond)
		alive := gen.Alive()
		if total-alive > lost {
			lost = total - alive
		}
		if lost > 0 && alive < total {
			dead.Store(true)
			// Reconnect what was lost: the rotation now skips the dead node.
			if err := gen.Reopen(ctx, 32); err != nil {
				continue
			}
		}
		if lost > 0 && gen.Alive() == total {
			recovered = time.Since(killed)
			deadlineOK = true
			break
		}
	}
	st, _ := gen.Measure(ctx, r.o.Window)
	m := map[string]float64{"tunnels": float64(total), "tunnels_lost": float64(lost), "recover_seconds": report.Round(recovered.Seconds(), 2), "p99_ms_after": st.P99ms}
	if !deadlineOK {
		m["recover_seconds"] = -1
	}
	r.res.Points = append(r.res.Points, report.Point{Scenario: "farm-failover", System: "deskway-2node", Params: map[string]any{"tunnels": total, "killed_nodes": 1}, Metrics: m})
	r.res.Summary["farm_failover_tunnels_lost"] = float64(lost)
	r.res.Summary["farm_failover_recover_seconds"] = m["recover_seconds"]
	return nil
}
