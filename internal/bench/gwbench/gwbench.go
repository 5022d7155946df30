package gwbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/bench/echo"
	"github.com/deskway/deskway/internal/bench/load"
	"github.com/deskway/deskway/internal/bench/procstat"
	"github.com/deskway/deskway/internal/bench/report"
)

// Options control a run.
type Options struct {
	Exe       string // the deskway binary that runs the gateway and echo server
	Out       string
	Command   string
	Scenarios []string
	// Steps are the tunnel counts of a ramp, in order.
	Steps       []int
	Warmup      time.Duration
	Window      time.Duration
	ThroughputD time.Duration
	// RelayLoops is the gateway's relay_loops; negative leaves its default
	// (two event loops per CPU), 0 relays on goroutines.
	RelayLoops int
	// Runs is how many times every system runs the knowledge-worker
	// ramps and the throughput test, interleaved (default 3).
	Runs int
	// CPULoads are the KW v1 tunnel counts where every system's CPU per
	// round trip and memory per tunnel are compared: each KW v1 ramp goes
	// on through them even past 40 ms (default 1,000 and 2,000).
	CPULoads []int
	Log      *slog.Logger
}

// AllScenarios in the order they run.
var AllScenarios = []string{"kw1", "kw2", "packet-size", "frequency", "cpus", "farm", "throughput"}

// DefaultSteps ramp from a hundred tunnels to the file-descriptor ceiling.
var DefaultSteps = []int{100, 250, 500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 5000, 6000, 7000, 8000}

// DefaultCPULoads are the equal loads of the CPU and memory comparison.
var DefaultCPULoads = []int{1000, 2000}

// thresholdMs is the paper's limit on added response time.
const thresholdMs = 40

// step is one measured point of a ramp.
type step struct {
	load.Stats
	AddedP99 float64
	CPUPct   float64
	RSS      int64
	CPUusRT  float64
	GenCPU   float64
	EchoCPU  float64
	Errors   int64
}

type ramp struct {
	system string
	run    int
	steps  []step
	idle   int64
	err    error
}

// maxUnder interpolates the tunnel count where metric crosses limit.
func maxUnder(steps []step, metric func(step) float64, limit float64) (float64, bool) {
	prevN, prevV := 0.0, 0.0
	for _, s := range steps {
		v := metric(s)
		if v > limit || s.Missing > 0 || s.Errors > 0 {
			if prevN == 0 {
				return 0, true
			}
			if v <= prevV || math.IsInf(v, 1) {
				return prevN, true
			}
			return prevN + (limit-prevV)/(v-prevV)*(float64(s.Tunnels)-prevN), true
		}
		prevN, prevV = float64(s.Tunnels), v
	}
	return prevN, false // never crossed: a lower bound
}

// directP99 is the direct path's p99 at n tunnels, interpolated between
// measured steps and held at the last one beyond them.
func directP99(direct []step, n int) float64 {
	if len(direct) == 0 {
		return 0
	}
	prev := direct[0]
	if n <= prev.Tunnels {
		return prev.P99ms
	}
	for _, s := range direct[1:] {
		if n <= s.Tunnels {
			f := float64(n-prev.Tunnels) / float64(s.Tunnels-prev.Tunnels)
			return prev.P99ms + f*(s.P99ms-prev.P99ms)
		}
		prev = s
	}
	return prev.P99ms
}

type runner struct {
	o      Options
	e      *env
	res    *report.Result
	direct map[string][]step // direct ramp per pattern key
	hap    *system
	hapErr error
	suites map[string]string // negotiated TLS per system
}

// Run executes the scenarios and writes result.json, result.md and charts.
func Run(ctx context.Context, o Options) (*report.Result, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if len(o.Steps) == 0 {
		o.Steps = DefaultSteps
	}
	if o.Runs <= 0 {
		o.Runs = 3
	}
	if len(o.CPULoads) == 0 {
		o.CPULoads = DefaultCPULoads
	}
	o.Steps = mergeSteps(o.Steps, o.CPULoads)
	dir, err := os.MkdirTemp("", "deskway-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	e, err := newEnv(o.Exe, dir, o.RelayLoops)
	if err != nil {
		return nil, err
	}
	defer e.close()
	r := &runner{o: o, e: e, direct: map[string][]step{}, suites: map[string]string{},
		res: &report.Result{Bench: "gateway", Command: o.Command, Started: time.Now().UTC(), Machine: report.ThisMachine(), Summary: map[string]float64{}}}
	if h, err := e.haproxy(); err == nil {
		r.hap = &h
	} else {
		r.hapErr = err
	}
	r.paperPoints()
	for _, sc := range o.Scenarios {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		o.Log.Info("scenario", "name", sc)
		var err error
		switch sc {
		case "kw1":
			err = r.knowledgeWorker(ctx, "kw1", load.Pattern{Up: 90, Down: 90, Count: 1, Interval: 100 * time.Millisecond})
		case "kw2":
			err = r.knowledgeWorker(ctx, "kw2", load.Pattern{Up: 25, Down: 1669, Count: 1, Interval: 200 * time.Millisecond})
		case "packet-size":
			err = r.packetSize(ctx)
		case "frequency":
			err = r.frequency(ctx)
		case "cpus":
			err = r.cpus(ctx)
		case "farm":
			err = r.farm(ctx)
		case "throughput":
			err = r.throughput(ctx)
		default:
			err = fmt.Errorf("unknown scenario %q (known: %s)", sc, strings.Join(AllScenarios, ", "))
		}
		if err != nil {
			return r.res, fmt.Errorf("bench: scenario %s: %w", sc, err)
		}
	}
	if err := r.checkSuites(); err != nil {
		return r.res, err
	}
	report.SortPoints(r.res.Points)
	if o.Out != "" {
		if err := r.write(o.Out); err != nil {
			return r.res, err
		}
	}
	return r.res, nil
}

func patternKey(p load.Pattern) string {
	return fmt.Sprintf("%d/%d/%d/%s", p.Up, p.Down, p.Count, p.Interval)
}

// runRamp ramps tunnels through sys until the response time limit is
// crossed at or past through tunnels, or a step fails.
func (r *runner) runRamp(ctx context.Context, sys system, p load.Pattern, cpus int, direct []step, run, through int) ramp {
	rp := ramp{system: sys.name, run: run}
	pr, dial, addr, err := sys.start(cpus)
	if err != nil {
		rp.err = err
		return rp
	}
	defer pr.stop()
	if err := r.recordSuite(ctx, sys.name, addr); err != nil {
		rp.err = err
		return rp
	}
	time.Sleep(300 * time.Millisecond)
	if pr != nil {
		if s, err := procstat.Read(pr.pid()); err == nil {
			rp.idle = s.RSS
		}
	}
	gen := load.New(dial, p)
	defer gen.Close()
	for _, n := range r.o.Steps {
		if ctx.Err() != nil {
			rp.err = ctx.Err()
			return rp
		}
		if err := gen.Grow(ctx, n, 32); err != nil {
			r.o.Log.Warn("could not open all tunnels", "system", sys.name, "tunnels", n, "err", err)
			rp.steps = append(rp.steps, step{Stats: load.Stats{Tunnels: n}, AddedP99: math.Inf(1), Errors: 1})
			break
		}
		time.Sleep(r.o.Warmup)
		errBefore := gen.Errors()
		var a, b procstat.Sample
		if pr != nil {
			a, _ = procstat.Read(pr.pid())
		}
		ga, _ := procstat.Read(0)
		ea, _ := procstat.Read(r.e.echo.pid())
		st, err := gen.Measure(ctx, r.o.Window)
		if pr != nil {
			b, _ = procstat.Read(pr.pid())
		}
		gb, _ := procstat.Read(0)
		eb, _ := procstat.Read(r.e.echo.pid())
		s := step{Stats: st, GenCPU: procstat.CPUPercent(ga, gb), EchoCPU: procstat.CPUPercent(ea, eb), Errors: gen.Errors() - errBefore}
		if err != nil {
			s.P99ms, s.AddedP99 = math.Inf(1), math.Inf(1)
		}
		if pr != nil {
			s.CPUPct, s.RSS = procstat.CPUPercent(a, b), b.RSS
			if st.RoundTrips > 0 {
				s.CPUusRT = float64((b.CPU - a.CPU).Microseconds()) / float64(st.RoundTrips)
			}
		}
		if direct != nil {
			s.AddedP99 = s.P99ms - directP99(direct, n)
		} else {
			s.AddedP99 = s.P99ms
		}
		rp.steps = append(rp.steps, s)
		r.o.Log.Info("step", "system", sys.name, "tunnels", n, "p50_ms", st.P50ms, "p99_ms", st.P99ms, "added_p99_ms", round(s.AddedP99, 2),
			"cpu_pct", round(s.CPUPct, 1), "cpu_us_per_rt", round(s.CPUusRT, 1), "rss_mb", s.RSS>>20, "gen_cpu_pct", round(s.GenCPU, 0), "missing", st.Missing)
		if s.Errors > 0 || (n >= through && (s.AddedP99 > thresholdMs || st.Missing > 0)) {
			break
		}
	}
	return rp
}

func round(v float64, d int) float64 {
	p := math.Pow(10, float64(d))
	return math.Round(v*p) / p
}

// addRamp records a ramp's steps as points and returns its 40 ms count.
func (r *runner) addRamp(scenario string, rp ramp, params map[string]any) (float64, bool) {
	if rp.err != nil && len(rp.steps) == 0 {
		r.res.Points = append(r.res.Points, report.Point{Scenario: scenario, System: rp.system, Params: params, Metrics: map[string]float64{}, Skipped: rp.err.Error()})
		return 0, false
	}
	if rp.err != nil {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("%s, %s run %d: ended early: %v", scenario, rp.system, rp.run, rp.err))
	}
	for _, s := range rp.steps {
		m := map[string]float64{
			"tunnels": float64(s.Tunnels), "round_trips": float64(s.RoundTrips), "p50_ms": s.P50ms, "p99_ms": s.P99ms, "max_ms": s.Maxms,
			"added_p99_ms": round(s.AddedP99, 3), "gen_cpu_pct": round(s.GenCPU, 1), "echo_cpu_pct": round(s.EchoCPU, 1),
			"missing": float64(s.Missing), "errors": float64(s.Errors),
		}
		if s.RSS > 0 {
			m["cpu_pct"], m["rss_bytes"], m["cpu_us_per_roundtrip"] = round(s.CPUPct, 1), float64(s.RSS), round(s.CPUusRT, 2)
			if s.Tunnels > 0 && rp.idle > 0 {
				m["bytes_per_tunnel"] = math.Round(float64(s.RSS-rp.idle) / float64(s.Tunnels))
			}
		}
		for k, v := range m {
			if math.IsInf(v, 0) || math.IsNaN(v) {
				m[k] = -1 // JSON has no infinity: -1 marks "no answer in the window"
			}
		}
		pp := map[string]any{"tunnels": s.Tunnels, "run": rp.run}
		for k, v := range params {
			pp[k] = v
		}
		r.res.Points = append(r.res.Points, report.Point{Scenario: scenario, System: rp.system, Params: pp, Metrics: m})
	}
	n, crossed := maxUnder(rp.steps, func(s step) float64 { return s.AddedP99 }, thresholdMs)
	mm := map[string]float64{"max_tunnels_40ms": math.Round(n)}
	if !crossed {
		mm["lower_bound"] = 1
	}
	sp := map[string]any{"run": rp.run}
	for k, v := range params {
		sp[k] = v
	}
	r.res.Points = append(r.res.Points, report.Point{Scenario: scenario + "-summary", System: rp.system, Params: sp, Metrics: mm})
	return n, crossed
}

// directRamp returns the direct path's ramp at p, running it the first
// time p is asked for; fresh is that run, nil when it was already known.
func (r *runner) directRamp(ctx context.Context, p load.Pattern) (steps []step, fresh *ramp, err error) {
	key := patternKey(p)
	if steps, ok := r.direct[key]; ok {
		return steps, nil, nil
	}
	d := r.runRamp(ctx, r.e.direct(), p, 0, nil, 1, 0)
	if d.err != nil {
		return nil, nil, d.err
	}
	r.direct[key] = d.steps
	return d.steps, &d, nil
}

// relays are the systems that relay tunnels, in the order of one run:
// deskway and HAProxy take turns going first, so neither always meets
// the host in the state the other left it.
func (r *runner) relays(scenario string, params map[string]any, run int) []system {
	systems := []system{r.e.deskway()}
	if r.hap == nil {
		if run == 1 {
			r.res.Points = append(r.res.Points, report.Point{Scenario: scenario, System: "haproxy", Params: params, Metrics: map[string]float64{}, Skipped: r.hapErr.Error()})
		}
		return systems
	}
	if run%2 == 0 {
		return []system{*r.hap, systems[0]}
	}
	return append(systems, *r.hap)
}

// pattern runs deskway and HAProxy at one pattern against the direct
// ramp of that pattern (measured once, the first time it is asked for)
// and returns their ramps.
func (r *runner) pattern(ctx context.Context, scenario string, p load.Pattern, params map[string]any, cpus int) (map[string]ramp, error) {
	out := map[string]ramp{}
	direct, fresh, err := r.directRamp(ctx, p)
	if err != nil {
		return nil, err
	}
	if fresh != nil {
		out["direct"] = *fresh
		r.addRamp(scenario, *fresh, params)
	}
	return out, r.relayRamps(ctx, scenario, p, params, cpus, direct, 1, 0, out)
}

// round is one run of a repeated scenario: a fresh direct ramp, then
// each relay against it.
func (r *runner) round(ctx context.Context, scenario string, p load.Pattern, params map[string]any, run, through int) (map[string]ramp, error) {
	d := r.runRamp(ctx, r.e.direct(), p, 0, nil, run, through)
	if d.err != nil {
		return nil, fmt.Errorf("direct: %w", d.err)
	}
	if _, ok := r.direct[patternKey(p)]; !ok {
		r.direct[patternKey(p)] = d.steps
	}
	r.addRamp(scenario, d, params)
	out := map[string]ramp{"direct": d}
	return out, r.relayRamps(ctx, scenario, p, params, 0, d.steps, run, through, out)
}

func (r *runner) relayRamps(ctx context.Context, scenario string, p load.Pattern, params map[string]any, cpus int, direct []step, run, through int, out map[string]ramp) error {
	for _, sys := range r.relays(scenario, params, run) {
		rp := r.runRamp(ctx, sys, p, cpus, direct, run, through)
		if rp.err != nil && len(rp.steps) == 0 {
			return fmt.Errorf("%s: %w", sys.name, rp.err)
		}
		out[sys.name] = rp
		r.addRamp(scenario, rp, params)
	}
	return nil
}

// knowledgeWorker runs a knowledge-worker pattern o.Runs times for every
// system and summarises the runs (see summarizeKW).
func (r *runner) knowledgeWorker(ctx context.Context, name string, p load.Pattern) error {
	params := map[string]any{"up_bytes": p.Up, "down_bytes": p.Down, "interval_ms": p.Interval.Milliseconds()}
	through := 0
	if name == "kw1" {
		through = slices.Max(r.o.CPULoads)
	}
	var runs []map[string]ramp
	for run := 1; run <= r.o.Runs; run++ {
		ramps, err := r.round(ctx, name, p, params, run, through)
		if err != nil {
			return fmt.Errorf("run %d: %w", run, err)
		}
		runs = append(runs, ramps)
	}
	summarizeKW(r.res.Summary, name, runs)
	if name == "kw1" {
		summarizeLoads(r.res.Summary, runs, r.o.CPULoads)
	}
	return nil
}

func (r *runner) packetSize(ctx context.Context) error {
	for _, size := range []int{10, 90, 200, 500, 1000, 2000} {
		p := load.Pattern{Up: size, Down: size, Count: 1, Interval: 100 * time.Millisecond}
		if _, err := r.pattern(ctx, "packet-size", p, map[string]any{"packet_bytes": size, "interval_ms": 100}, 0); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) frequency(ctx context.Context) error {
	for _, ms := range []int{10, 100, 500, 1000} {
		p := load.Pattern{Up: 90, Down: 90, Count: 1, Interval: time.Duration(ms) * time.Millisecond}
		if _, err := r.pattern(ctx, "frequency", p, map[string]any{"packet_bytes": 90, "interval_ms": ms}, 0); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) cpus(ctx context.Context) error {
	p := load.Pattern{Up: 90, Down: 90, Count: 1, Interval: 100 * time.Millisecond}
	direct, _, err := r.directRamp(ctx, p)
	if err != nil {
		return err
	}
	for _, c := range []int{1, 2} {
		params := map[string]any{"cpus": c, "up_bytes": 90, "down_bytes": 90, "interval_ms": 100}
		rp := r.runRamp(ctx, r.e.deskway(), p, c, direct, 1, 0)
		n, _ := r.addRamp("cpus", rp, params)
		r.res.Summary[fmt.Sprintf("cpus%d_kw1_max_tunnels_40ms", c)] = math.Round(n)
		if r.hap != nil {
			hp := r.runRamp(ctx, *r.hap, p, c, direct, 1, 0)
			r.addRamp("cpus", hp, params)
		}
	}
	return nil
}

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
			r.res.Summary["farm2_haproxy_ratio_1node_median"] = round(median(rs), 2)
			r.res.Summary["farm2_haproxy_ratio_1node_worst"] = round(slices.Min(rs), 2)
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
	m := map[string]float64{"tunnels": float64(total), "tunnels_lost": float64(lost), "recover_seconds": round(recovered.Seconds(), 2), "p99_ms_after": st.P99ms}
	if !deadlineOK {
		m["recover_seconds"] = -1
	}
	r.res.Points = append(r.res.Points, report.Point{Scenario: "farm-failover", System: "deskway-2node", Params: map[string]any{"tunnels": total, "killed_nodes": 1}, Metrics: m})
	r.res.Summary["farm_failover_tunnels_lost"] = float64(lost)
	r.res.Summary["farm_failover_recover_seconds"] = m["recover_seconds"]
	return nil
}

// throughput is the ctsTraffic-like test: bulk data from the host to the
// client over 1 and 8 streams through each system, o.Runs times, the
// systems' order turning every run.
func (r *runner) throughput(ctx context.Context) error {
	systems := []system{r.e.direct(), r.e.deskway()}
	if r.hap != nil {
		systems = append(systems, *r.hap)
	} else {
		r.res.Points = append(r.res.Points, report.Point{Scenario: "throughput", System: "haproxy", Metrics: map[string]float64{}, Skipped: r.hapErr.Error()})
	}
	var runs []map[string]float64
	for run := 1; run <= r.o.Runs; run++ {
		gbps := map[string]float64{}
		for _, streams := range []int{1, 8} {
			for i := range systems {
				sys := systems[(i+run-1)%len(systems)]
				g, cpu, err := r.bulk(ctx, sys, streams)
				if err != nil {
					return fmt.Errorf("%s %d streams, run %d: %w", sys.name, streams, run, err)
				}
				gbps[fmt.Sprintf("%s/%d", sys.name, streams)] = g
				m := map[string]float64{"gbps": round(g, 3)}
				if cpu >= 0 {
					m["cpu_pct"] = round(cpu, 1)
				}
				r.res.Points = append(r.res.Points, report.Point{Scenario: "throughput", System: sys.name,
					Params: map[string]any{"streams": streams, "seconds": r.o.ThroughputD.Seconds(), "run": run}, Metrics: m})
				r.o.Log.Info("throughput", "system", sys.name, "streams", streams, "run", run, "gbps", round(g, 3))
			}
		}
		runs = append(runs, gbps)
	}
	summarizeThroughput(r.res.Summary, runs)
	return nil
}

func (r *runner) bulk(ctx context.Context, sys system, streams int) (float64, float64, error) {
	pr, dial, addr, err := sys.start(0)
	if err != nil {
		return 0, 0, err
	}
	defer pr.stop()
	if err := r.recordSuite(ctx, sys.name, addr); err != nil {
		return 0, 0, err
	}
	var conns []io.ReadWriteCloser
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < streams; i++ {
		c, err := dial(ctx)
		if err != nil {
			return 0, 0, err
		}
		conns = append(conns, c)
		if _, err := c.Write(echo.Hello{Mode: echo.ModeBulk}.Append(nil)); err != nil {
			return 0, 0, err
		}
	}
	var total atomic.Int64
	var counting atomic.Bool
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 256<<10)
			for {
				n, err := c.Read(buf)
				if counting.Load() {
					total.Add(int64(n))
				}
				if err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(time.Second) // reach steady state
	var a, b procstat.Sample
	if pr != nil {
		a, _ = procstat.Read(pr.pid())
	}
	start := time.Now()
	counting.Store(true)
	time.Sleep(r.o.ThroughputD)
	counting.Store(false)
	el := time.Since(start)
	cpu := -1.0
	if pr != nil {
		b, _ = procstat.Read(pr.pid())
		cpu = procstat.CPUPercent(a, b)
	}
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
	conns = nil
	if total.Load() == 0 {
		return 0, cpu, errors.New("no data flowed")
	}
	return float64(total.Load()) * 8 / el.Seconds() / 1e9, cpu, nil
}

// paperPoints are the published figures, as system "paper", so the
// tables show them beside the measured ones.
func (r *runner) paperPoints() {
	add := func(sc string, params map[string]any, m map[string]float64) {
		r.res.Points = append(r.res.Points, report.Point{Scenario: sc, System: "paper", Params: params, Metrics: m})
	}
	add("kw1-summary", map[string]any{"up_bytes": 90, "down_bytes": 90, "interval_ms": 100, "gateway_cores": 4}, map[string]float64{"max_tunnels_40ms": 1230, "cpu_us_per_roundtrip": 325, "bytes_per_tunnel": 0.69 * (1 << 20)})
	add("kw2-summary", map[string]any{"up_bytes": 25, "down_bytes": 1669, "interval_ms": 200, "gateway_cores": 4}, map[string]float64{"max_tunnels_40ms": 1173})
	for size, n := range map[int]float64{10: 1300, 90: 1230, 200: 1199, 500: 975, 1000: 887, 2000: 258} {
		add("packet-size-summary", map[string]any{"packet_bytes": size, "interval_ms": 100}, map[string]float64{"max_tunnels_40ms": n})
	}
	for ms, n := range map[int]float64{10: 494, 100: 1230, 500: 1230, 1000: 1230} {
		add("frequency-summary", map[string]any{"packet_bytes": 90, "interval_ms": ms}, map[string]float64{"max_tunnels_40ms": n})
	}
	for c, n := range map[int]float64{1: 368, 2: 656, 4: 1230} {
		add("cpus-summary", map[string]any{"cpus": c}, map[string]float64{"max_tunnels_40ms": n})
	}
	for nodes, n := range map[int]float64{1: 1230, 2: 1970, 3: 2700} {
		add("farm-summary", map[string]any{"nodes": nodes}, map[string]float64{"max_tunnels_40ms": n})
	}
	add("throughput", map[string]any{"streams": 1, "note": "RAS Gateway GRE, 10 cores"}, map[string]float64{"gbps": 0.45})
	add("throughput", map[string]any{"streams": "many", "note": "RAS Gateway GRE, 10 cores"}, map[string]float64{"gbps": 2.0})
	slices.SortFunc(r.res.Points, func(a, b report.Point) int { return strings.Compare(a.Scenario, b.Scenario) })
}
