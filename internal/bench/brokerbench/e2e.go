package brokerbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/bench/procstat"
	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/bench/simagent"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
)

// E2E configures the end-to-end mode: launches whose sessions take a
// real logon's time to appear, reported by the agent's own poll, on hosts
// sized to fill, with users who relaunch and who log off.
type E2E struct {
	Launches    int
	Concurrency []int
	RTTs        []time.Duration
	// LogonMedian and LogonSigma shape the log-normal logon time: from
	// the launch's answer to the session being on the host.
	LogonMedian time.Duration
	LogonSigma  float64
	// SessionPoll is how often each host's agent reads its sessions.
	SessionPoll time.Duration
	// RelaunchShare of launches are users launching again while their
	// session runs (their client dropped): the broker must reconnect them.
	RelaunchShare float64
	// LogoffShare of new sessions log off ¼ to 1½ median logons (5 to
	// 30 s at the default) after their logon.
	LogoffShare float64
	// Reconnect is how long a reconnected session takes to show active.
	Reconnect time.Duration
	// Headroom is the hosts' session capacity over the distinct users:
	// 1.05 leaves 5 % free, so hosts fill as the storm ends.
	Headroom float64
	// Seed makes the users' draws repeatable.
	Seed uint64
}

func (e *E2E) defaults() {
	if e.Launches == 0 {
		e.Launches = 1500
	}
	if len(e.Concurrency) == 0 {
		e.Concurrency = []int{12, 60}
	}
	if len(e.RTTs) == 0 {
		e.RTTs = []time.Duration{10 * time.Millisecond, 250 * time.Millisecond}
	}
	if e.LogonMedian == 0 {
		e.LogonMedian = 20 * time.Second
	}
	if e.LogonSigma == 0 {
		e.LogonSigma = 0.35
	}
	if e.SessionPoll == 0 {
		e.SessionPoll = time.Second // the agent's default agent.session_poll
	}
	if e.RelaunchShare == 0 {
		e.RelaunchShare = 0.10
	}
	if e.LogoffShare == 0 {
		e.LogoffShare = 0.05
	}
	if e.Reconnect == 0 {
		e.Reconnect = 2 * time.Second
	}
	if e.Headroom == 0 {
		e.Headroom = 1.05
	}
	if e.Seed == 0 {
		e.Seed = 1
	}
}

// sessionLimit sizes the hosts so that the distinct users fill them to
// within the headroom.
func (e *E2E) sessionLimit(hosts int) int {
	users := math.Round(float64(e.Launches) * (1 - e.RelaunchShare))
	return int(math.Ceil(users * e.Headroom / float64(hosts)))
}

// meanLogon is the log-normal's mean: median × e^(σ²/2).
func (e *E2E) meanLogon() time.Duration {
	return time.Duration(float64(e.LogonMedian) * math.Exp(e.LogonSigma*e.LogonSigma/2))
}

// simSession is a session on an end-to-end host: it shows once its logon
// is over, and leaves at its logoff.
type simSession struct {
	state    string
	showAt   time.Time
	logoffAt time.Time // zero: stays
	// then becomes the state at thenAt (a reconnect finishing).
	then   string
	thenAt time.Time
}

// e2eHost is a session host whose sessions log on in their own time; an
// agent loop (agent.Diff over its sessions every poll, and heartbeats)
// reports them, as the real agent does.
type e2eHost struct {
	name, cred string
	mu         sync.Mutex
	sessions   map[string]*simSession
}

// view is what the host's session list shows at now.
func (h *e2eHost) view(now time.Time) []brokerapi.Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []brokerapi.Session
	for u, s := range h.sessions {
		if !s.logoffAt.IsZero() && !now.Before(s.logoffAt) {
			delete(h.sessions, u)
			continue
		}
		if s.then != "" && !now.Before(s.thenAt) {
			s.state, s.then = s.then, ""
		}
		if !now.Before(s.showAt) {
			out = append(out, brokerapi.Session{User: u, State: s.state})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].User < out[j].User })
	return out
}

func (h *e2eHost) run(ctx context.Context, c *brokerclient.Client, poll, beat time.Duration, log *slog.Logger) {
	simagent.Agent{
		Host: h.name, Poll: poll, Beat: beat, View: h.view,
		Events: func(ctx context.Context, ev brokerapi.Events) {
			if err := c.Events(ctx, h.cred, ev); err != nil && ctx.Err() == nil {
				log.Warn("simulated host: events", "host", h.name, "error", err)
			}
		},
		Heartbeat: func(ctx context.Context, hb brokerapi.Heartbeat) {
			if _, err := c.Heartbeat(ctx, h.cred, hb); err != nil && ctx.Err() == nil {
				log.Warn("simulated host: heartbeat", "host", h.name, "error", err)
			}
		},
	}.Run(ctx)
}

// e2ePoint runs one end-to-end storm.
func (o *Options) e2ePoint(ctx context.Context, tmp, dsn, pgAddr string, rtt time.Duration, c int) (report.Point, error) {
	e := &o.E2E
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
	limit := e.sessionLimit(o.Hosts)
	f, err := o.startFarm(ctx, &wg, tmp, dsn, pgAddr, rtt, c, limit, o.LogonLimit)
	if err != nil {
		return report.Point{}, err
	}
	// The hosts stop before the broker and the database's proxy do, so
	// that a point's end is no database outage to the broker.
	hctx, hcancel := context.WithCancel(ctx)
	var hw sync.WaitGroup
	defer func() { hcancel(); hw.Wait() }()
	hosts := map[string]*e2eHost{}
	for name, cred := range f.creds {
		h := &e2eHost{name: name, cred: cred, sessions: map[string]*simSession{}}
		hosts[name] = h
		hw.Add(1)
		go func() {
			defer hw.Done()
			h.run(hctx, f.client, e.SessionPoll, f.cfg.Broker.HeartbeatInterval.D(), o.Log)
		}()
	}
	rng := rand.New(rand.NewPCG(e.Seed, uint64(c)*1000+uint64(rtt.Milliseconds())))
	var rngMu sync.Mutex
	draw := func() float64 { rngMu.Lock(); defer rngMu.Unlock(); return rng.Float64() }
	normal := func() float64 { rngMu.Lock(); defer rngMu.Unlock(); return rng.NormFloat64() }
	// The users launched so far, and where their sessions run.
	var usersMu sync.Mutex
	var launched []string
	placedOn := map[string]string{}
	relaunching := map[string]bool{}
	var newUsers, lastShow atomic.Int64
	later := func(t time.Time) {
		for {
			cur := lastShow.Load()
			if t.UnixNano() <= cur || lastShow.CompareAndSwap(cur, t.UnixNano()) {
				return
			}
		}
	}
	// relaunchable picks a user whose session runs and shows active.
	relaunchable := func() (string, *e2eHost) {
		usersMu.Lock()
		defer usersMu.Unlock()
		for range 8 {
			if len(launched) == 0 {
				return "", nil
			}
			u := launched[int(draw()*float64(len(launched)))]
			h := hosts[placedOn[u]]
			if relaunching[u] {
				continue
			}
			h.mu.Lock()
			s, ok := h.sessions[u]
			now := time.Now()
			if ok && s.state == store.Active && s.then == "" && !now.Before(s.showAt) && s.logoffAt.IsZero() {
				s.state = store.Disconnected // the client dropped: the user launches again
				h.mu.Unlock()
				relaunching[u] = true
				return u, h
			}
			h.mu.Unlock()
		}
		return "", nil
	}
	// Exactly the planned number of distinct users launch, so that they
	// fill the hosts as sized; the rest relaunch. Early in a storm no
	// session has logged on yet to relaunch, so a relaunch drawn then is
	// a new user, and one drawn when no new user is left waits for a
	// session to show.
	planned := int64(math.Round(float64(e.Launches) * (1 - e.RelaunchShare)))
	var newLeft atomic.Int64
	newLeft.Store(planned)
	pick := func() (string, *e2eHost, error) {
		relaunch := draw() < e.RelaunchShare
		for deadline := time.Now().Add(2 * time.Minute); ; {
			if relaunch {
				if u, h := relaunchable(); u != "" {
					return u, h, nil
				}
			}
			if newLeft.Add(-1) >= 0 {
				return fmt.Sprintf("user%05d", newUsers.Add(1)), nil, nil
			}
			newLeft.Add(1)
			relaunch = true
			if time.Now().After(deadline) || ctx.Err() != nil {
				return "", nil, errors.New("brokerbench: no running session to relaunch for two minutes")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	type outcome struct {
		d        time.Duration
		desktop  time.Duration // answer plus logon: when the user sees a desktop
		relaunch bool
		err      error
		noHost   bool
	}
	results := make([]outcome, e.Launches)
	var retries, logoffs, reconnects atomic.Int64
	waits0 := counter(f.reg, "deskway_broker_busy_waits_total")
	cpu0 := procstat.Self()
	start := time.Now()
	each(ctx, c, e.Launches, func(i int) {
		user, was, err := pick()
		if err != nil {
			results[i] = outcome{err: err}
			return
		}
		t0 := time.Now()
		res, r, err := f.client.Launch(ctx, brokerclient.Bearer(frontendToken),
			brokerapi.LaunchRequest{DeliveryGroup: group, User: user, Groups: []string{group}})
		d := time.Since(t0)
		retries.Add(int64(r))
		out := outcome{d: d, relaunch: was != nil}
		var se *brokerclient.StatusError
		switch {
		case err != nil:
			out.err = err
			out.noHost = errors.As(err, &se) && se.Status == http.StatusServiceUnavailable && se.RetryAfter == 0
		case was != nil:
			if !res.Reconnect || res.Host != was.name {
				out.err = fmt.Errorf("relaunch of %s went to %s (reconnect %v), not back to its session on %s", user, res.Host, res.Reconnect, was.name)
				break
			}
			reconnects.Add(1)
			show := time.Now().Add(e.Reconnect)
			was.mu.Lock()
			if s := was.sessions[user]; s != nil {
				s.then, s.thenAt = store.Active, show
			}
			was.mu.Unlock()
			later(show)
			out.desktop = d + e.Reconnect
		default:
			logon := time.Duration(float64(e.LogonMedian) * math.Exp(e.LogonSigma*normal()))
			show := time.Now().Add(logon)
			s := &simSession{state: store.Active, showAt: show}
			if draw() < e.LogoffShare {
				// 5 to 30 s after a 20 s logon: a quarter to one and a
				// half median logons, and never within three polls, or
				// the agent could miss the session altogether (the
				// broker then ends its record after broker.logon_grace).
				s.logoffAt = show.Add(max(time.Duration((0.25+1.25*draw())*float64(e.LogonMedian)), 3*e.SessionPoll))
				logoffs.Add(1)
				later(s.logoffAt)
			}
			later(show)
			h := hosts[res.Host]
			h.mu.Lock()
			h.sessions[user] = s
			h.mu.Unlock()
			usersMu.Lock()
			launched = append(launched, user)
			placedOn[user] = res.Host
			usersMu.Unlock()
			out.desktop = d + logon
		}
		if was != nil {
			usersMu.Lock()
			delete(relaunching, user)
			usersMu.Unlock()
		}
		results[i] = out
	})
	wall := time.Since(start)
	cpu := procstat.Self() - cpu0
	busyWaits := counter(f.reg, "deskway_broker_busy_waits_total") - waits0

	var ok, desk []time.Duration
	errs, noHost, relaunches := 0, 0, 0
	var firstErr string
	byMsg := map[string]int{}
	for _, r := range results {
		if r.relaunch {
			relaunches++
		}
		if r.err != nil {
			errs++
			if r.noHost {
				noHost++
			}
			if firstErr == "" {
				firstErr = r.err.Error()
			}
			byMsg[r.err.Error()]++
			continue
		}
		ok = append(ok, r.d)
		desk = append(desk, r.desktop)
	}
	// A failed launch's own words say which limit or fault it met; the
	// counts alone cannot.
	for msg, n := range byMsg {
		o.Log.Warn("launches failed", "count", n, "error", msg)
	}
	sortDur(ok)
	sortDur(desk)
	meanLogon := e.meanLogon() + e.SessionPoll/2
	m := map[string]float64{
		"launches":       float64(e.Launches),
		"new_users":      float64(newUsers.Load()),
		"relaunches":     float64(relaunches),
		"reconnects":     float64(reconnects.Load()),
		"logoffs":        float64(logoffs.Load()),
		"errors":         float64(errs),
		"no_host_errors": float64(noHost),
		"error_pct":      100 * float64(errs) / float64(e.Launches),
		"launches_per_s": float64(len(ok)) / wall.Seconds(),
		"wall_s":         wall.Seconds(),
		"retries":        float64(retries.Load()),
		"busy_waits":     busyWaits,
		"session_limit":  float64(limit),
		"logon_limit":    float64(o.LogonLimit),
		"logon_median_s": e.LogonMedian.Seconds(),
		"bench_cpu_pct":  100 * cpu.Seconds() / wall.Seconds() / float64(runtime.NumCPU()),
		// What each limit allows: the hosts' logon slots turn over once
		// per logon (plus half a poll before the agent reports it); the
		// database, one round trip per launch per launch in flight.
		"bound_logon_per_s": float64(o.Hosts*o.LogonLimit) / meanLogon.Seconds(),
	}
	if rtt > 0 {
		m["bound_database_per_s"] = float64(c) / rtt.Seconds()
	}
	if len(ok) > 0 {
		m["median_ms"] = report.Millis(ok[len(ok)/2])
		m["p90_ms"] = report.Millis(ok[len(ok)*9/10])
		m["p99_ms"] = report.Millis(ok[min(len(ok)-1, len(ok)*99/100)])
		m["max_ms"] = report.Millis(ok[len(ok)-1])
		m["desktop_median_s"] = desk[len(desk)/2].Seconds()
		m["desktop_p90_s"] = desk[len(desk)*9/10].Seconds()
	}
	bottleneck := bottleneckOf(m)
	// Every logon and logoff reaches the broker: once the last has shown
	// and the agents have polled, the database holds exactly the hosts'
	// sessions.
	settle := time.Until(time.Unix(0, lastShow.Load())) + 2*e.SessionPoll + time.Second
	select {
	case <-ctx.Done():
		return report.Point{}, ctx.Err()
	case <-time.After(max(settle, 0)):
	}
	// Should the database have stalled during the storm, the broker may
	// have refused events or placed launches from its local host cache;
	// the hosts' heartbeats, and the write-back once the broker is
	// back on the database, bring it level. That takes up to two
	// heartbeats after the broker's next look at the database.
	agreed, err := f.agreeWithin(ctx, hosts, 2*f.cfg.Broker.HeartbeatInterval.D()+2*brokerRecheck, o.Log)
	if err != nil {
		return report.Point{}, err
	}
	m["agree_wait_s"] = agreed.Seconds()
	p := report.Point{Scenario: "launch-storm-e2e", System: "deskway-postgres",
		Params: map[string]any{"rtt_ms": rtt.Milliseconds(), "concurrency": c, "hosts": o.Hosts, "bottleneck": bottleneck}, Metrics: m}
	if firstErr != "" {
		p.Params["first_error"] = firstErr
	}
	o.Log.Info("end-to-end point", "rtt", rtt, "concurrency", c, "launches_per_s", report.Round(m["launches_per_s"], 2),
		"median_ms", report.Round(m["median_ms"], 2), "desktop_median_s", report.Round(m["desktop_median_s"], 2), "errors", errs,
		"relaunches", relaunches, "logoffs", logoffs.Load(), "busy_waits", busyWaits, "bottleneck", bottleneck,
		"agree_wait_s", report.Round(m["agree_wait_s"], 2))
	return p, nil
}

// bottleneckOf names the limit that set a point's pace: hosts that were
// full, else the lowest of the rates the logon limit, the database round
// trip and the machine's CPU allow.
func bottleneckOf(m map[string]float64) string {
	if m["no_host_errors"] > 0 {
		return "session capacity"
	}
	name, rate := "logon limit", m["bound_logon_per_s"]
	if db, ok := m["bound_database_per_s"]; ok && db < rate {
		name, rate = "database round trip", db
	}
	// A machine whose every core is busy sets the pace below both.
	if m["bench_cpu_pct"] >= 90 && m["launches_per_s"] < 0.8*rate {
		name = "CPU"
	}
	return name
}

// brokerRecheck is how often a broker on its local host cache tries the
// database again (broker.cacheRefresh).
const brokerRecheck = 5 * time.Second

// agreeWithin waits, up to limit, for the database's live sessions to be
// the hosts' own, and returns how long that took.
func (f *farm) agreeWithin(ctx context.Context, hosts map[string]*e2eHost, limit time.Duration, log *slog.Logger) (time.Duration, error) {
	start := time.Now()
	for {
		err := agree(ctx, f.st, hosts)
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) > limit {
			return 0, fmt.Errorf("%w (%s after the storm)", err, limit)
		}
		log.Debug("the database does not yet agree with the hosts", "error", err)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// agree checks that the database's live sessions are the hosts' own.
func agree(ctx context.Context, st *store.Store, hosts map[string]*e2eHost) error {
	want := map[string]string{}
	now := time.Now()
	for name, h := range hosts {
		for _, s := range h.view(now) {
			want[s.User] = name + "/" + s.State
		}
	}
	live, err := st.Sessions(ctx, "", false, len(want)+10000)
	if err != nil {
		return err
	}
	got := map[string]string{}
	for _, s := range live {
		got[s.User] = s.Host + "/" + s.State
	}
	var diff []string
	for u, w := range want {
		if got[u] != w {
			diff = append(diff, fmt.Sprintf("%s: host has %s, database %q", u, w, got[u]))
		}
	}
	for u, g := range got {
		if _, ok := want[u]; !ok {
			diff = append(diff, fmt.Sprintf("%s: database has %s, no host does", u, g))
		}
	}
	if len(diff) > 0 {
		sort.Strings(diff)
		return fmt.Errorf("brokerbench: after the end-to-end storm %d sessions differ between the hosts and the database, e.g. %v", len(diff), diff[:min(5, len(diff))])
	}
	return nil
}

func sortDur(d []time.Duration) { sort.Slice(d, func(i, j int) bool { return d[i] < d[j] }) }
