package bootstorm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/bench/procstat"
	"github.com/deskway/deskway/internal/bench/report"
)

// Scenarios are the parts of the bench, as the paper names them.
var Scenarios = []string{"storm", "read"}

// DefaultClients are the paper's boot-storm group sizes, then the larger
// ones the issue asks for.
var DefaultClients = []int{1, 5, 10, 25, 50, 75, 100, 250, 500, 1000}

// DefaultReaders are the reader counts of the aggregate read test.
var DefaultReaders = []int{10, 25, 50}

// slowRequest is the paper's UDP retry timeout: a request slower than
// this would have been a "retry".
const slowRequest = 200 * time.Millisecond

// Options configure a run.
type Options struct {
	Exe       string // the deskway binary, started as the server
	Out       string
	Command   string
	Scenarios []string
	Clients   []int
	Readers   []int
	// TimeScale multiplies the trace's think time (1 replays the
	// recorded pace; 0 replays as fast as the server answers).
	TimeScale float64
	// ReadFor is how long each aggregate-read step runs.
	ReadFor time.Duration
	// QueueDepth is how many requests one client keeps in flight.
	QueueDepth int
	// DiscardReads has the clients drop read data in the kernel (recv
	// with MSG_TRUNC) instead of copying it out: each client stands in
	// for a machine of its own, whose cost of receiving is not the
	// server's, and this takes less of the shared box.
	DiscardReads bool
	// Runs repeats every step, the systems taking turns run by run; the
	// point reports each figure's median run, as the paper's figures are
	// medians.
	Runs int
	// Verify has copying clients compare every byte they read outside
	// the trace's writes with the base image; a difference fails the
	// client. Smoke runs set it, so that a fast but wrong server cannot
	// show a figure.
	Verify bool
	Trace  []byte // nil: the committed boot trace
	// Systems limits the run to these names (deskway, nbd-server-cow,
	// nbdkit-cow, qemu-nbd, floor); empty means all.
	Systems []string
	Log     *slog.Logger
}

type runner struct {
	o    Options
	tr   *trace
	dir  string
	base string
	res  *report.Result
}

// Run measures every system and writes the results when o.Out is set.
func Run(ctx context.Context, o Options) (*report.Result, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if len(o.Clients) == 0 {
		o.Clients = DefaultClients
	}
	if len(o.Readers) == 0 {
		o.Readers = DefaultReaders
	}
	if o.QueueDepth == 0 {
		o.QueueDepth = 4
	}
	if o.Runs == 0 {
		o.Runs = 1
	}
	if o.ReadFor == 0 {
		o.ReadFor = 5 * time.Second
	}
	raw := o.Trace
	if raw == nil {
		raw = defaultTrace
	}
	tr, err := parseTrace(raw)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "deskway-bootstorm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r := &runner{o: o, tr: tr, dir: dir, res: &report.Result{Bench: "stream", Command: o.Command, Started: time.Now().UTC(),
		Machine: report.ThisMachine(), Summary: map[string]float64{}}}
	if r.base, err = makeBase(dir, tr.end); err != nil {
		return nil, err
	}
	want := func(name string) bool { return len(o.Systems) == 0 || slices.Contains(o.Systems, name) }
	var systems []system
	if want("deskway") {
		systems = append(systems, deskway(o.Exe))
	}
	for _, peer := range []func() (system, error){nbdServer, nbdkitCow, qemuNBD} {
		s, err := peer()
		if !want(s.name) {
			continue
		}
		if err != nil {
			o.Log.Warn("peer missing", "peer", s.name, "err", err)
			r.res.Points = append(r.res.Points, report.Point{Scenario: "storm", System: s.name, Metrics: map[string]float64{}, Skipped: err.Error()})
			continue
		}
		systems = append(systems, s)
	}
	if want(floorName) {
		systems = append(systems, floor(o.Exe))
	}
	o.Log.Info("trace", "requests", len(tr.ops), "read_mib", tr.readBytes>>20, "write_kib", tr.writeBytes>>10, "span", tr.span)
	for _, sc := range o.Scenarios {
		var steps []int
		switch sc {
		case "storm":
			steps = o.Clients
		case "read":
			steps = o.Readers
		default:
			return nil, fmt.Errorf("bench: unknown scenario %q (have %v)", sc, Scenarios)
		}
		for _, n := range steps {
			points, err := interleave(ctx, systems, max(o.Runs, 1), func(sys system) (report.Point, error) {
				p, err := r.run(ctx, sys, sc, n)
				if err != nil {
					return p, fmt.Errorf("%s %s %d: %w", sc, sys.name, n, err)
				}
				return p, nil
			})
			if err != nil {
				return nil, err
			}
			for _, p := range points {
				r.res.Points = append(r.res.Points, medianOf(p, sc, max(o.Runs, 1)))
			}
		}
	}
	r.summarize(systems)
	if o.Out != "" {
		if err := r.write(systems); err != nil {
			return nil, err
		}
	}
	return r.res, nil
}

// checker returns the fleet's check for Verify: bytes read outside every
// block the trace writes, zeroes or trims must be the base's (all
// clients replay one trace, so those blocks are the same for all); it
// adds what it compared to verified.
func (r *runner) checker(verified *atomic.Int64) (check func(off int64, p []byte) error, done func(), err error) {
	base, err := os.Open(r.base)
	if err != nil {
		return nil, nil, err
	}
	const blk = 4096
	written := map[int64]bool{}
	for _, o := range r.tr.ops {
		if o.cmd == 'W' || o.cmd == 'Z' || o.cmd == 'T' {
			for b := o.off / blk; b*blk < o.off+int64(o.n); b++ {
				written[b] = true
			}
		}
	}
	return func(off int64, p []byte) error {
		want := make([]byte, len(p))
		if _, err := base.ReadAt(want, off); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		for i := 0; i < len(p); {
			pos := off + int64(i)
			n := min(len(p)-i, int(blk-pos%blk))
			if !written[pos/blk] {
				if !bytes.Equal(p[i:i+n], want[i:i+n]) {
					return fmt.Errorf("bench: %d bytes read at %d differ from the base image, which no request of the trace writes there", n, pos)
				}
				verified.Add(int64(n))
			}
			i += n
		}
		return nil
	}, func() { base.Close() }, nil
}

// makeBase writes a base image covering the trace with incompressible
// data, so no layer can shortcut reads of zeroes.
func makeBase(dir string, end int64) (string, error) {
	path := filepath.Join(dir, "golden.img")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	size := (end + 1<<20 - 1) &^ (1<<20 - 1)
	chunk := make([]byte, 1<<20)
	rng := rand.New(rand.NewSource(1))
	for off := int64(0); off < size; off += int64(len(chunk)) {
		rng.Read(chunk)
		if _, err := f.WriteAt(chunk, off); err != nil {
			return "", err
		}
	}
	return path, f.Close()
}

// clientResult is one client's boot (or read run).
type clientResult struct {
	took  time.Duration
	slow  int
	reads int64
	lat   []float64 // request latencies, ms
	// slowCmd counts slow requests by what they asked: reads, writes
	// (data, zeroes or trim) and flushes; slowAt is when each was sent,
	// from the client's start.
	slowCmd [3]int
	slowAt  []time.Duration
	err     error
}

// slowKinds names clientResult.slowCmd's counts in a point's metrics.
var slowKinds = [3]string{"slow_reads", "slow_writes", "slow_flushes"}

// slowKind is the slowCmd index of a trace command.
func slowKind(cmd byte) int {
	switch cmd {
	case 'R':
		return 0
	case 'F':
		return 2
	}
	return 1
}

// slowBucket is the span the slow requests of a storm are counted in.
const slowBucket = 5 * time.Second

// slowWhen adds to m what the slow requests of a storm asked and when:
// their count by kind, and the busiest slowBucket of the storm (its
// start in seconds and its share of them); it returns the counts of
// every bucket from the start, for the log.
func slowWhen(results []clientResult, m map[string]float64) []int {
	var byKind [3]int
	var buckets []int
	total := 0
	for _, cr := range results {
		for k, n := range cr.slowCmd {
			byKind[k] += n
		}
		for _, at := range cr.slowAt {
			b := int(at / slowBucket)
			for len(buckets) <= b {
				buckets = append(buckets, 0)
			}
			buckets[b]++
			total++
		}
	}
	for k, name := range slowKinds {
		m[name] = float64(byKind[k])
	}
	if total > 0 {
		peak := 0
		for b, n := range buckets {
			if n > buckets[peak] {
				peak = b
			}
		}
		m["slow_peak_at_s"] = (time.Duration(peak) * slowBucket).Seconds()
		m["slow_peak_share"] = report.Round(float64(buckets[peak])/float64(total), 3)
	}
	return buckets
}

// interleave measures every system runs times, the systems taking
// turns run by run (deskway, the floor, deskway, ...), so a change in
// what else the machine does falls on every system alike, as it would
// not if each ran its storms back to back; it returns each system's
// runs in the order of systems.
func interleave(ctx context.Context, systems []system, runs int, run func(system) (report.Point, error)) ([][]report.Point, error) {
	points := make([][]report.Point, len(systems))
	for range runs {
		for i, sys := range systems {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			p, err := run(sys)
			if err != nil {
				return nil, err
			}
			points[i] = append(points[i], p)
		}
	}
	return points, nil
}

// medianOf is the point of one system's runs at a step: the median run
// (by slow requests for a storm, by throughput for reads) in which each
// compared figure (slow requests, failed clients, boot time, throughput,
// server CPU-seconds) is that figure's own median over the runs, with the spread beside it:
// the *_min and *_max, the worst run's in slow_requests_max,
// failed_clients_max and boot_median_s_max.
func medianOf(points []report.Point, scenario string, runs int) report.Point {
	by := "slow_requests"
	if scenario == "read" {
		by = "read_gbps"
	}
	med := medianPoint(points, by)
	med.Params["runs"] = runs
	return med
}

// medianPoint is the median run of points by the figure by, in which each
// compared figure (slow requests, failed clients, boot time, throughput,
// server CPU-seconds) is that figure's own median over the runs, with
// its *_min and *_max.
func medianPoint(points []report.Point, by string) report.Point {
	slices.SortStableFunc(points, func(a, b report.Point) int {
		switch x, y := a.Metrics[by], b.Metrics[by]; {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	med := points[len(points)/2]
	for _, k := range []string{"slow_requests", "failed_clients", "boot_median_s", "read_gbps", "cpu_s"} {
		var vs []float64
		for _, p := range points {
			if v, ok := p.Metrics[k]; ok {
				vs = append(vs, v)
			}
		}
		if len(vs) == 0 {
			continue
		}
		// Each compared figure is its own median over the runs: the
		// median run chosen by that figure. Picked by slow requests
		// alone, three runs tied at none gave the fastest boot.
		slices.Sort(vs)
		med.Metrics[k] = vs[len(vs)/2]
		med.Metrics[k+"_min"], med.Metrics[k+"_max"] = vs[0], vs[len(vs)-1]
	}
	return med
}

// run is one measurement with a freshly started server.
func (r *runner) run(ctx context.Context, sys system, scenario string, n int) (report.Point, error) {
	sdir, err := os.MkdirTemp(r.dir, sys.name+"-")
	if err != nil {
		return report.Point{}, err
	}
	defer os.RemoveAll(sdir)
	srv, err := sys.start(sdir, r.base)
	if err != nil {
		return report.Point{}, err
	}
	defer srv.stop()
	idle, err := procstat.ReadTree(srv.pid)
	if err != nil {
		return report.Point{}, err
	}
	// Memory is sampled through the run; its peak (less the write caches
	// deskway reports) is what the clients cost. RSS is read from /proc
	// every tick; the cache figure is a scrape of the server's /metrics,
	// which costs the server CPU the peers do not spend, so it is taken
	// only every cacheEvery ticks, and on the next tick again when the
	// cache moved under a sample.
	const cacheEvery = 10
	var peakRSS, peakBeyondCache atomic.Int64
	// sample reads RSS and, when withCache, the memory beyond the write
	// caches; it reports false when that figure was asked for and could
	// not be had.
	sample := func(withCache bool) bool {
		var cacheBefore int64
		if withCache {
			cacheBefore = srv.cacheBytes()
		}
		s, err := procstat.ReadTree(srv.pid)
		if err != nil {
			return false
		}
		if s.RSS > peakRSS.Load() {
			peakRSS.Store(s.RSS)
		}
		beyond := s.RSS
		switch {
		case withCache:
			// RSS is read between two looks at the cache. When every
			// client writes a megabyte at once the cache grows by
			// hundreds of megabytes between them, and RSS less either
			// look is not the memory beyond it: such samples are left
			// out of that figure.
			cacheAfter := srv.cacheBytes()
			if d := cacheAfter - cacheBefore; d > max(cacheBefore/100, 1<<20) || -d > max(cacheBefore/100, 1<<20) {
				return false
			}
			beyond -= cacheAfter
		case srv.cacheBytes != nil:
			return true
		}
		if beyond > peakBeyondCache.Load() {
			peakBeyondCache.Store(beyond)
		}
		return true
	}
	sampleDone := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampleDone)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		// The first sample is taken at once, so a step shorter than the
		// tick still has one; a cache-aware sample the cache moved under
		// is tried again on the next tick.
		due := true
		for tick := 0; ; tick++ {
			if tick > 0 {
				select {
				case <-stopSampling:
					return
				case <-t.C:
				}
			}
			withCache := srv.cacheBytes != nil && (due || tick%cacheEvery == 0)
			ok := sample(withCache)
			if withCache {
				due = !ok
			}
		}
	}()
	f, err := newFleet(r.o.DiscardReads, r.tr.maxLen)
	if err != nil {
		return report.Point{}, err
	}
	defer f.close()
	var verified atomic.Int64
	if r.o.Verify && !r.o.DiscardReads {
		check, done, err := r.checker(&verified)
		if err != nil {
			return report.Point{}, err
		}
		defer done()
		f.check = check
	}
	jobs := make([]job, n)
	for i := range jobs {
		if scenario == "storm" {
			jobs[i] = job{addr: srv.addr, export: srv.export(i, true), ops: r.tr.ops, depth: r.o.QueueDepth,
				scale: r.o.TimeScale, latencies: true}
		} else {
			// Readers read through boot exports, as the peers read
			// through their copy-on-write paths.
			jobs[i] = job{addr: srv.addr, export: srv.export(i, true), ops: r.tr.reads(), depth: 8,
				cycle: true, runFor: r.o.ReadFor}
		}
	}
	start := time.Now()
	results := f.run(ctx, jobs)
	wall := time.Since(start)
	end, _ := procstat.ReadTree(srv.pid)
	close(stopSampling)
	<-sampleDone
	// A step shorter than a tick, or one whose every cache-aware sample
	// raced a burst of writes, still gets one figure beyond the caches:
	// the fleet is done, so the caches hold still (they may be smaller
	// than at the peak, which only makes the figure larger).
	for try := 0; srv.cacheBytes != nil && peakBeyondCache.Load() == 0 && try < 20; try++ {
		if !sample(true) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	// A short step may end before the first sample.
	if end.RSS > peakRSS.Load() {
		peakRSS.Store(end.RSS)
	}

	var times, lat []float64
	var slow, failed int
	var reads int64
	var firstErr error
	for _, cr := range results {
		reads += cr.reads
		slow += cr.slow
		lat = append(lat, cr.lat...)
		if cr.err != nil {
			failed++
			if firstErr == nil {
				firstErr = cr.err
			}
			continue
		}
		times = append(times, cr.took.Seconds())
	}
	slices.Sort(times)
	cpu := 100 * (end.CPU - idle.CPU).Seconds() / wall.Seconds()
	m := map[string]float64{
		"clients": float64(n), "failed_clients": float64(failed), "slow_requests": float64(slow),
		"cpu_pct": report.Round(cpu, 1), "cpu_s": report.Round((end.CPU - idle.CPU).Seconds(), 2), "rss_idle_bytes": float64(idle.RSS), "rss_peak_bytes": float64(peakRSS.Load()),
		"bytes_read": float64(reads), "read_gbps": report.Round(float64(reads)*8/wall.Seconds()/1e9, 3),
		"read_mb_s": report.Round(float64(reads)/wall.Seconds()/1e6, 1), "wall_s": report.Round(wall.Seconds(), 2),
	}
	slowBuckets := slowWhen(results, m)
	if f.check != nil {
		m["verified_bytes"] = float64(verified.Load())
	}
	if len(times) > 0 {
		m["boot_median_s"] = report.Round(times[len(times)/2], 2)
		m["boot_max_s"] = report.Round(times[len(times)-1], 2)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		m["request_p50_ms"] = report.Round(lat[len(lat)/2], 2)
		m["request_p99_ms"] = report.Round(lat[len(lat)*99/100], 2)
		m["request_max_ms"] = report.Round(lat[len(lat)-1], 1)
	}
	// What each client costs, its write cache and reserved slab included;
	// and beside it, for deskway, what it costs beyond the write caches.
	m["rss_per_client_bytes"] = report.Round(float64(max(0, peakRSS.Load()-idle.RSS))/float64(n), 0)
	if srv.cacheBytes != nil && peakBeyondCache.Load() > 0 {
		m["rss_beyond_cache_per_client_bytes"] = report.Round(float64(max(0, peakBeyondCache.Load()-idle.RSS))/float64(n), 0)
	}
	log := r.o.Log.With("scenario", scenario, "system", sys.name, "clients", n)
	if failed > 0 {
		log.Warn("clients failed", "failed", failed, "first_error", firstErr)
	}
	log.Info("step", "boot_median_s", m["boot_median_s"], "boot_max_s", m["boot_max_s"], "slow", slow,
		"p99_ms", m["request_p99_ms"], "max_ms", m["request_max_ms"],
		"slow_reads", m["slow_reads"], "slow_writes", m["slow_writes"], "slow_flushes", m["slow_flushes"],
		"slow_per_5s", slowBuckets,
		"cpu_pct", m["cpu_pct"], "cpu_s", m["cpu_s"], "rss_mib", peakRSS.Load()>>20, "read_mb_s", m["read_mb_s"])
	return report.Point{Scenario: scenario, System: sys.name, Params: map[string]any{"clients": n}, Metrics: m}, nil
}
