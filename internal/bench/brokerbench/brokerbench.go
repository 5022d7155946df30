// Package brokerbench is the brokering paper's test rebuilt: simulated
// session hosts (agents speaking the real agent API) in one delivery
// group, a storm of user launches at fixed concurrency against a real
// broker over HTTPS, and the broker's PostgreSQL put a given round trip
// away by a latency proxy. It reports what the paper reports, for deskway
// and beside the paper's published figures.
package brokerbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/bench/procstat"
	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/pgcluster"
	"github.com/deskway/deskway/internal/tlsconf"
)

// Options configure a run.
type Options struct {
	Hosts       int             // simulated session hosts (paper: 57)
	Launches    int             // user launches per point (paper: 10,000)
	Concurrency []int           // launches in flight (paper: 12 … 60)
	RTTs        []time.Duration // broker ↔ PostgreSQL round trips (paper: 10 … 250 ms)
	// Systems are the databases measured: postgres (over each RTT) and
	// sqlite (embedded, no latency).
	Systems []string
	// SessionLimit and LogonLimit are each host's limits.
	SessionLimit, LogonLimit int
	// LogonAfter is how often a simulated host reports the logons of the
	// sessions placed on it: the paper's simulated sessions log on at once.
	LogonAfter time.Duration
	// Modes are what is measured: placement (every launch's session logs
	// on at once, the paper's setting) and e2e (real logon times).
	Modes []string
	// E2E configures the end-to-end mode.
	E2E E2E
	// BrokerLog receives the broker's own log (default: warnings and up
	// to Log), so a launch storm does not log every launch.
	BrokerLog *slog.Logger
	Out       string
	Command   string
	Log       *slog.Logger
}

func (o *Options) defaults() {
	if o.Hosts == 0 {
		o.Hosts = 57
	}
	if o.Launches == 0 {
		o.Launches = 10000
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{12, 24, 36, 48, 60}
	}
	if len(o.RTTs) == 0 {
		o.RTTs = []time.Duration{10 * time.Millisecond, 45 * time.Millisecond, 90 * time.Millisecond, 160 * time.Millisecond, 250 * time.Millisecond}
	}
	if len(o.Systems) == 0 {
		o.Systems = []string{"postgres", "sqlite"}
	}
	if o.SessionLimit == 0 {
		o.SessionLimit = (o.Launches+o.Hosts*8)/o.Hosts + 20
	}
	if o.LogonLimit == 0 {
		o.LogonLimit = 5
	}
	if o.LogonAfter == 0 {
		o.LogonAfter = 100 * time.Millisecond
	}
	if len(o.Modes) == 0 {
		o.Modes = []string{"placement", "e2e"}
	}
	o.E2E.defaults()
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.BrokerLog == nil {
		o.BrokerLog = slog.New(&minLevel{h: o.Log.Handler(), min: slog.LevelWarn})
	}
}

const (
	tokenKey      = "brokerbench-token-key-0123456789abcdef"
	frontendToken = "brokerbench-frontend"
	group         = "bench"
)

// Run measures every point and writes the result when Out is set.
func Run(ctx context.Context, o Options) (*report.Result, error) {
	o.defaults()
	res := &report.Result{Bench: "broker", Command: o.Command, Started: time.Now().UTC(), Machine: report.ThisMachine(),
		Summary: map[string]float64{}}
	tmp, err := os.MkdirTemp("", "deskway-brokerbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := tlsconf.SelfSigned(filepath.Join(tmp, "tls.crt"), filepath.Join(tmp, "tls.key"), nil); err != nil {
		return nil, err
	}
	placement, e2e := false, false
	for _, m := range o.Modes {
		switch m {
		case "placement":
			placement = true
		case "e2e":
			e2e = true
		default:
			return nil, fmt.Errorf("brokerbench: unknown mode %q (placement, e2e)", m)
		}
	}
	var pg *pgcluster.Cluster
	startPG := func() error {
		if pg != nil {
			return nil
		}
		// A durable server, as production runs it: commits wait for the WAL.
		var err error
		pg, err = pgcluster.Start(ctx, pgcluster.Options{Durable: true, MaxConnections: 400})
		return err
	}
	defer func() {
		if pg != nil {
			pg.Stop()
		}
	}()
	n := 0
	for _, sys := range o.Systems {
		if !placement {
			break
		}
		switch sys {
		case "postgres":
			if !pgcluster.Available() {
				res.Points = append(res.Points, report.Point{Scenario: "launch-storm", System: "deskway-postgres",
					Metrics: map[string]float64{}, Skipped: "PostgreSQL is not installed (apt-get install postgresql)"})
				continue
			}
			if err := startPG(); err != nil {
				return nil, err
			}
			for _, rtt := range o.RTTs {
				for _, c := range o.Concurrency {
					n++
					dsn, err := pg.CreateDB(ctx, fmt.Sprintf("bench%d", n), "")
					if err != nil {
						return nil, err
					}
					p, err := o.point(ctx, tmp, "postgres", dsn, pg.Addr(), rtt, c)
					if err != nil {
						return nil, err
					}
					res.Points = append(res.Points, p)
				}
			}
		case "sqlite":
			for i, c := range o.Concurrency {
				p, err := o.point(ctx, tmp, "sqlite", filepath.Join(tmp, fmt.Sprintf("bench%d.db", i)), "", 0, c)
				if err != nil {
					return nil, err
				}
				res.Points = append(res.Points, p)
			}
		default:
			return nil, fmt.Errorf("brokerbench: unknown system %q (postgres, sqlite)", sys)
		}
	}
	if e2e && !pgcluster.Available() {
		res.Points = append(res.Points, report.Point{Scenario: "launch-storm-e2e", System: "deskway-postgres",
			Metrics: map[string]float64{}, Skipped: "PostgreSQL is not installed (apt-get install postgresql)"})
	} else if e2e {
		if err := startPG(); err != nil {
			return nil, err
		}
		for _, rtt := range o.E2E.RTTs {
			for _, c := range o.E2E.Concurrency {
				n++
				dsn, err := pg.CreateDB(ctx, fmt.Sprintf("bench%d", n), "")
				if err != nil {
					return nil, err
				}
				p, err := o.e2ePoint(ctx, tmp, dsn, pg.Addr(), rtt, c)
				if err != nil {
					return nil, err
				}
				res.Points = append(res.Points, p)
			}
		}
	}
	if placement {
		res.Points = append(res.Points, paperPoints()...)
	}
	summarize(res)
	res.Notes = notes(o, placement, e2e)
	if o.Out != "" {
		if err := write(res, o.Out); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// point runs one storm: a fresh database, a broker, the simulated hosts,
// then Launches launches at concurrency c.
func (o *Options) point(ctx context.Context, tmp, dialect, dsn, pgAddr string, rtt time.Duration, c int) (report.Point, error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var f *farm
	defer func() {
		cancel()
		wg.Wait()
		if f != nil {
			f.close()
		}
	}()
	f, err := o.startFarm(ctx, &wg, tmp, dsn, pgAddr, rtt, c, o.SessionLimit, o.LogonLimit)
	if err != nil {
		return report.Point{}, err
	}
	client, st, reg := f.client, f.st, f.reg
	// The hosts stop before the broker and the database's proxy do, so
	// that a point's end is no database outage to the broker.
	hctx, hcancel := context.WithCancel(ctx)
	var hw sync.WaitGroup
	defer func() { hcancel(); hw.Wait() }()
	hosts := map[string]*simHost{}
	for name, cred := range f.creds {
		h := &simHost{name: name, cred: cred}
		hosts[name] = h
		hw.Add(1)
		go func() { defer hw.Done(); h.run(hctx, client, o.LogonAfter, f.cfg.Broker.HeartbeatInterval.D(), o.Log) }()
	}
	launch := func(user string) (time.Duration, int, error) {
		start := time.Now()
		res, retries, err := client.Launch(ctx, brokerclient.Bearer(frontendToken),
			brokerapi.LaunchRequest{DeliveryGroup: group, User: user, Groups: []string{group}})
		if err != nil {
			return time.Since(start), retries, err
		}
		hosts[res.Host].logon(user)
		return time.Since(start), retries, nil
	}
	// Warm the broker's connection pool and statement cache, untimed, as a
	// broker in service has them.
	var warm sync.WaitGroup
	for i := range c {
		warm.Add(1)
		go func() {
			defer warm.Done()
			if _, _, err := launch(fmt.Sprintf("warm%03d", i)); err != nil {
				o.Log.Warn("warm-up launch", "error", err)
			}
		}()
	}
	warm.Wait()
	lat := make([]time.Duration, o.Launches)
	failed := make([]bool, o.Launches)
	var retries atomic.Int64
	var firstErr atomic.Value
	waits0 := counter(reg, "deskway_broker_busy_waits_total")
	cpu0 := procstat.Self()
	start := time.Now()
	each(ctx, c, o.Launches, func(i int) {
		d, r, err := launch(fmt.Sprintf("user%05d", i))
		lat[i] = d
		retries.Add(int64(r))
		if err != nil {
			failed[i] = true
			firstErr.CompareAndSwap(nil, err.Error())
		}
	})
	wall := time.Since(start)
	cpu := procstat.Self() - cpu0
	var ok []time.Duration
	errs := 0
	var sum time.Duration
	for i, d := range lat {
		if failed[i] {
			errs++
			continue
		}
		ok = append(ok, d)
		sum += d
	}
	sort.Slice(ok, func(i, j int) bool { return ok[i] < ok[j] })
	m := map[string]float64{
		"launches":           float64(o.Launches),
		"errors":             float64(errs),
		"error_pct":          100 * float64(errs) / float64(o.Launches),
		"launches_per_s":     float64(len(ok)) / wall.Seconds(),
		"wall_s":             wall.Seconds(),
		"retries":            float64(retries.Load()),
		"busy_waits":         counter(reg, "deskway_broker_busy_waits_total") - waits0,
		"bench_cpu_s":        cpu.Seconds(),
		"bench_cpu_ms_per_l": 1000 * cpu.Seconds() / float64(o.Launches),
	}
	if len(ok) > 0 {
		m["avg_response_s"] = (sum / time.Duration(len(ok))).Seconds()
		m["median_ms"] = report.Millis(ok[len(ok)/2])
		m["p99_ms"] = report.Millis(ok[min(len(ok)-1, len(ok)*99/100)])
		m["max_ms"] = report.Millis(ok[len(ok)-1])
	}
	// What the store holds afterwards: every success is one live session.
	live, err := st.Sessions(ctx, "", false, o.Launches+10*c+1000)
	if err != nil {
		return report.Point{}, err
	}
	m["live_sessions"] = float64(len(live))
	if want := len(ok) + c; len(live) != want {
		return report.Point{}, fmt.Errorf("brokerbench: %d live sessions after %d successful launches and %d warm-ups", len(live), len(ok), c)
	}
	p := report.Point{Scenario: "launch-storm", System: "deskway-" + dialect,
		Params: map[string]any{"rtt_ms": rtt.Milliseconds(), "concurrency": c, "hosts": o.Hosts}, Metrics: m}
	if e, _ := firstErr.Load().(string); e != "" {
		p.Params["first_error"] = e
	}
	o.Log.Info("point", "db", dialect, "rtt", rtt, "concurrency", c, "launches_per_s", report.Round(m["launches_per_s"], 2),
		"avg_s", report.Round(m["avg_response_s"], 2), "median_ms", report.Round(m["median_ms"], 2), "errors", errs, "retries", retries.Load(), "busy_waits", m["busy_waits"])
	return p, nil
}

// minLevel drops records below min.
type minLevel struct {
	h   slog.Handler
	min slog.Level
}

func (m *minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.h.Enabled(ctx, l)
}
func (m *minLevel) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }
func (m *minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return &minLevel{h: m.h.WithAttrs(a), min: m.min}
}
func (m *minLevel) WithGroup(g string) slog.Handler {
	return &minLevel{h: m.h.WithGroup(g), min: m.min}
}

// counter reads a counter's value from reg (0 when absent).
func counter(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

var errNoPoint = errors.New("no such point")

// find returns the metrics of system's placement point at rtt and
// concurrency.
func find(res *report.Result, system string, rtt int64, c int) (map[string]float64, error) {
	p, err := findPoint(res, "launch-storm", system, rtt, c)
	return p.Metrics, err
}

// findPoint returns scenario's point of system at rtt and concurrency.
func findPoint(res *report.Result, scenario, system string, rtt int64, c int) (report.Point, error) {
	for _, p := range res.Points {
		if p.Scenario != scenario || p.System != system || p.Skipped != "" {
			continue
		}
		if toInt64(p.Params["rtt_ms"]) == rtt && int(toInt64(p.Params["concurrency"])) == c {
			return p, nil
		}
	}
	return report.Point{}, errNoPoint
}

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int64:
		return x
	case float64:
		return int64(x)
	}
	return -1
}

// summarize names each figure for what it is: rttN_c60 keys are the point
// at the fixed concurrency of 60 (the paper's), rttN_max keys the highest
// rate at that RTT over every concurrency measured, and at which.
func summarize(res *report.Result) {
	for _, rtt := range []int64{10, 250} {
		best, at := 0.0, 0
		for _, p := range res.Points {
			if p.Scenario == "launch-storm" && p.System == "deskway-postgres" && toInt64(p.Params["rtt_ms"]) == rtt && p.Metrics["launches_per_s"] > best {
				best, at = p.Metrics["launches_per_s"], int(toInt64(p.Params["concurrency"]))
			}
		}
		if at > 0 {
			res.Summary[fmt.Sprintf("rtt%d_max_launches_per_s", rtt)] = report.Round(best, 2)
			res.Summary[fmt.Sprintf("rtt%d_max_at_concurrency", rtt)] = float64(at)
		}
	}
	if m, err := find(res, "deskway-postgres", 10, 60); err == nil {
		res.Summary["rtt10_c60_launches_per_s"] = report.Round(m["launches_per_s"], 2)
	}
	if m, err := find(res, "deskway-postgres", 250, 60); err == nil {
		res.Summary["rtt250_c60_launches_per_s"] = report.Round(m["launches_per_s"], 2)
		res.Summary["rtt250_c60_median_ms"] = report.Round(m["median_ms"], 2)
	}
	if p, err := findPoint(res, "launch-storm-e2e", "deskway-postgres", 10, 60); err == nil {
		res.Summary["e2e_rtt10_c60_launches_per_s"] = report.Round(p.Metrics["launches_per_s"], 2)
		res.Summary["e2e_median_ms"] = report.Round(p.Metrics["median_ms"], 2)
		res.SummaryText = map[string]string{"e2e_bottleneck": fmt.Sprint(p.Params["bottleneck"])}
	}
	if p, err := findPoint(res, "launch-storm-e2e", "deskway-postgres", 250, 60); err == nil {
		res.Summary["e2e_rtt250_c60_launches_per_s"] = report.Round(p.Metrics["launches_per_s"], 2)
	}
	worst := 0.0
	for _, p := range res.Points {
		if strings.HasPrefix(p.System, "deskway") {
			worst = max(worst, p.Metrics["error_pct"])
		}
	}
	res.Summary["max_error_pct"] = worst
}

// each runs do(i) for every i below n on c workers, the launch storm's
// fixed concurrency, and stops handing out work when ctx ends.
func each(ctx context.Context, c, n int, do func(i int)) {
	var next atomic.Int64
	var workers sync.WaitGroup
	for range c {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				do(i)
			}
		}()
	}
	workers.Wait()
}
