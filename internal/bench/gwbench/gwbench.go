package gwbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"time"

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
	// CompareExe, when set, is another deskway binary whose gateway runs
	// as the system "deskway-compare" right after deskway in every run.
	CompareExe string
	Log        *slog.Logger
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
		r.o.Log.Info("step", "system", sys.name, "tunnels", n, "p50_ms", st.P50ms, "p99_ms", st.P99ms, "added_p99_ms", report.Round(s.AddedP99, 2),
			"cpu_pct", report.Round(s.CPUPct, 1), "cpu_us_per_rt", report.Round(s.CPUusRT, 1), "rss_mb", s.RSS>>20, "gen_cpu_pct", report.Round(s.GenCPU, 0), "missing", st.Missing)
		if s.Errors > 0 || (n >= through && (s.AddedP99 > thresholdMs || st.Missing > 0)) {
			break
		}
	}
	return rp
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
			"added_p99_ms": report.Round(s.AddedP99, 3), "gen_cpu_pct": report.Round(s.GenCPU, 1), "echo_cpu_pct": report.Round(s.EchoCPU, 1),
			"missing": float64(s.Missing), "errors": float64(s.Errors),
		}
		if s.RSS > 0 {
			m["cpu_pct"], m["rss_bytes"], m["cpu_us_per_roundtrip"] = report.Round(s.CPUPct, 1), float64(s.RSS), report.Round(s.CPUusRT, 2)
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
// the host in the state the other left it (a comparison build runs
// between them, after deskway in one run and before it in the next).
func (r *runner) relays(scenario string, params map[string]any, run int) []system {
	systems := []system{r.e.deskway()}
	if r.o.CompareExe != "" {
		systems = append(systems, r.e.gatewayFrom("deskway-compare", r.o.CompareExe))
	}
	if r.hap == nil {
		if run == 1 {
			r.res.Points = append(r.res.Points, report.Point{Scenario: scenario, System: "haproxy", Params: params, Metrics: map[string]float64{}, Skipped: r.hapErr.Error()})
		}
		return systems
	}
	if run%2 == 0 {
		slices.Reverse(systems)
		return append([]system{*r.hap}, systems...)
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
