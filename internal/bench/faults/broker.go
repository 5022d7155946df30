package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/pgcluster"
)

// brokerScale is the broker scenario's load and fault timing.
type brokerScale struct {
	rate            float64 // new users' launches started per second
	inflight        int     // most launches in flight at once
	hosts           int
	sessionLimit    int
	logonLimit      int
	before          time.Duration // storm before the fault
	after           time.Duration // storm after the fault (kill) or after the database is back
	outage          time.Duration // how long PostgreSQL is stopped
	answerWithin    time.Duration // a launch not answered within it is lost
	logonMin, logon time.Duration // a session's logon takes logonMin to logonMin+logon
	relaunchShare   float64       // launches that are users launching again while their session runs
}

func brokerScaleFor(small bool) brokerScale {
	if small {
		return brokerScale{rate: 10, inflight: 8, hosts: 6, sessionLimit: 60, logonLimit: 10, before: 3 * time.Second,
			after: 5 * time.Second, outage: 10 * time.Second, answerWithin: 40 * time.Second, logonMin: 500 * time.Millisecond, logon: 1500 * time.Millisecond, relaunchShare: 0.1}
	}
	return brokerScale{rate: 40, inflight: 60, hosts: 40, sessionLimit: 100, logonLimit: 10, before: 8 * time.Second,
		after: 12 * time.Second, outage: 30 * time.Second, answerWithin: 60 * time.Second, logonMin: 500 * time.Millisecond, logon: 1500 * time.Millisecond, relaunchShare: 0.1}
}

// brokerScenario is scenario 2: a broker dies mid-storm, then the
// database stops for a while.
func brokerScenario() Scenario {
	return Scenario{Name: "broker", Run: runBroker}
}

// runBroker runs both cases, each on a fresh database of one PostgreSQL
// cluster with two fresh brokers.
func runBroker(ctx context.Context, env Env, run int) ([]Outcome, error) {
	sc := brokerScaleFor(env.Small)
	pg, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return nil, fmt.Errorf("faults: broker: %w", err)
	}
	defer pg.Stop()
	kill := brokerCase{name: "kill-broker", fault: "kill -9 one of two brokers mid-storm",
		inject: func(ctx context.Context, f *brokerFarm) (time.Time, time.Time, error) {
			// Mid-storm means holding a launch: the kill waits (a few
			// seconds at most) for the broker to hold one.
			for deadline := time.Now().Add(5 * time.Second); f.lb.launching[0].Load() == 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			f.heldAtKill = int(f.lb.launching[0].Load())
			start := time.Now()
			f.brokers[0].kill9()
			return start, time.Now().Add(sc.after), nil // the broker stays dead
		}}
	stopDB := brokerCase{name: "stop-database", outage: true, fault: fmt.Sprintf("PostgreSQL stopped (immediate) for %v mid-storm, then started", sc.outage),
		inject: func(ctx context.Context, f *brokerFarm) (time.Time, time.Time, error) {
			start := time.Now()
			if err := pg.Kill(ctx); err != nil {
				return start, start, err
			}
			select {
			case <-ctx.Done():
				return start, start, ctx.Err()
			case <-time.After(sc.outage):
			}
			if err := pg.Restart(ctx); err != nil {
				return start, start, err
			}
			return start, time.Now(), nil
		}}
	var out []Outcome
	for _, c := range []brokerCase{kill, stopDB} {
		o, err := c.run(ctx, env, pg, sc, run)
		if err != nil {
			return out, fmt.Errorf("faults: broker, %s, run %d: %w", c.name, run, err)
		}
		env.Log.Info("fault case done", "scenario", "broker", "case", c.name, "run", run, "held", o.Held, "affected", o.Affected,
			"recover_s", o.RecoverS, "lost", o.Metrics["launches_lost"], "doubled", o.Metrics["launches_doubled"])
		out = append(out, o)
	}
	return out, nil
}

// brokerCase is one fault under the storm. inject strikes, and returns
// when it struck and when the fault ends (for a killed broker, when the
// storm is to end).
type brokerCase struct {
	name, fault string
	inject      func(ctx context.Context, f *brokerFarm) (start, end time.Time, err error)
	// outage marks a fault that takes the database away for a while:
	// the storm goes on for sc.after once it is back, and a user
	// launching again at the broker that did not place their session may
	// get a second one, as architecture.md documents.
	outage bool
	// via, when set, gives the address the brokers reach the database
	// by in place of dsn (a fault proxy) and what to close after.
	via func(dsn string) (string, func(), error)
}

// launchRec is what one user's launch came to.
type launchRec struct {
	user       string
	start, end time.Time
	attempts   int
	ok         bool
	answered   bool // ok, or refused in plain words (no room)
	host       string
	err        string
	// wantHost is, for a user launching again while their session runs,
	// the host it runs on: the answer must send them back there.
	wantHost string
	// tries is each request the launch made, for the timeline of a
	// launch found lost.
	tries []brokerCall
}

func (c brokerCase) run(ctx context.Context, env Env, pg *pgcluster.Cluster, sc brokerScale, run int) (Outcome, error) {
	dir := filepath.Join(env.Work, fmt.Sprintf("broker-%s-run%d", c.name, run))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Outcome{}, err
	}
	dsn, err := pg.CreateDB(ctx, fmt.Sprintf("faults_%s_%d", map[string]string{"kill-broker": "kill", "stop-database": "stopdb", "cut-database": "cutdb"}[c.name], run), "")
	if err != nil {
		return Outcome{}, err
	}
	farmDSN := dsn
	if c.via != nil {
		var done func()
		if farmDSN, done, err = c.via(dsn); err != nil {
			return Outcome{}, err
		}
		defer done()
	}
	f, err := startBrokerFarm(ctx, env, dir, farmDSN, 2, sc.hosts, sc.sessionLimit, sc.logonLimit)
	if err != nil {
		return Outcome{}, err
	}
	defer f.close()

	var mu sync.Mutex
	var recs []*launchRec
	var wg sync.WaitGroup
	sem := make(chan struct{}, sc.inflight)
	stormStart := time.Now()
	faultAt := stormStart.Add(sc.before)
	type faultResult struct {
		start, end time.Time
		err        error
	}
	faultDone := make(chan faultResult, 1)
	strikeAt := faultAt
	go func() {
		select {
		case <-ctx.Done():
			faultDone <- faultResult{err: ctx.Err()}
			return
		case <-time.After(time.Until(strikeAt)):
		}
		env.Log.Info("fault", "scenario", "broker", "case", c.name, "run", run)
		start, end, err := c.inject(ctx, f)
		faultDone <- faultResult{start: start, end: end, err: err}
	}()
	// Launches start at a steady rate, each a new user, until the fault
	// has ended and sc.after has passed.
	var faultEnd, stormEnd time.Time
	tick := time.NewTicker(time.Duration(float64(time.Second) / sc.rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		if stormEnd.IsZero() {
			select {
			case fr := <-faultDone:
				if fr.err != nil {
					wg.Wait()
					return Outcome{}, fr.err
				}
				faultAt, faultEnd = fr.start, fr.end
				stormEnd = faultEnd
				if c.outage {
					stormEnd = faultEnd.Add(sc.after)
				}
			default:
			}
		}
		if !stormEnd.IsZero() && time.Now().After(stormEnd) {
			break
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return Outcome{}, ctx.Err()
		case <-tick.C:
		}
		mu.Lock()
		rec := &launchRec{user: fmt.Sprintf("user%05d", i+1)}
		if rand.Float64() < sc.relaunchShare {
			if u, h := f.relaunchable(); u != "" {
				rec = &launchRec{user: u, wantHost: h}
			}
		}
		recs = append(recs, rec)
		mu.Unlock()
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return Outcome{}, ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			launchUser(ctx, f, sc, rec)
			if rec.wantHost != "" {
				f.relaunched(rec.user)
			}
		}()
	}
	wg.Wait()
	if c.name == "kill-broker" {
		faultEnd = stormEnd
	}
	v, err := verifyFarm(ctx, f, dsn, recs, 90*time.Second)
	if err != nil {
		return Outcome{}, err
	}
	if v.timelines, err = userTimelines(ctx, f, dsn, recs, v.missing, faultAt); err != nil {
		return Outcome{}, err
	}
	doubled, err := userTimelines(ctx, f, dsn, recs, slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(v.twoSessions), v.misdirected...)))), faultAt)
	if err != nil {
		return Outcome{}, err
	}
	v.timelines = append(v.timelines, doubled...)
	return brokerOutcome(c, sc, run, recs, faultAt, faultEnd, v, f.heldAtKill), nil
}

// launchUser launches rec.user through the balancer until the launch is
// answered or sc.answerWithin has passed, and connects the user to the
// host the answer names.
func launchUser(ctx context.Context, f *brokerFarm, sc brokerScale, rec *launchRec) {
	rec.start = time.Now()
	deadline := rec.start.Add(sc.answerWithin)
	req := brokerapi.LaunchRequest{DeliveryGroup: farmGroup, User: rec.user, Groups: []string{farmGroup}}
	for {
		rec.attempts++
		var res *brokerapi.LaunchResponse
		actx, cancel := context.WithDeadline(ctx, deadline)
		err := f.lb.do(actx, func(c *brokerclient.Client) error {
			i := f.lb.index(c)
			held := &f.lb.launching[i]
			held.Add(1)
			defer held.Add(-1)
			at := time.Now()
			var err error
			res, _, err = c.Launch(actx, brokerclient.Bearer(farmFrontend), req)
			rec.tries = append(rec.tries, newBrokerCall(at, i, err))
			return err
		})
		cancel()
		rec.end = time.Now()
		if err == nil {
			rec.ok, rec.answered, rec.host = true, true, res.Host
			h := f.hosts[res.Host]
			if h == nil {
				rec.ok, rec.err = false, fmt.Sprintf("answered with host %q, which is none of the farm's", res.Host)
				return
			}
			h.connect(rec.user, sc.logonMin+time.Duration(rand.Int64N(int64(sc.logon))))
			if rec.wantHost == "" {
				f.connected(rec.user, res.Host)
			}
			return
		}
		rec.err = err.Error()
		var se *brokerclient.StatusError
		if errors.As(err, &se) && (se.Status/100 == 4 || se.Status == http.StatusServiceUnavailable && se.RetryAfter == 0) {
			rec.answered = true // a refusal in words: no room, or not allowed
			return
		}
		if ctx.Err() != nil || !time.Now().Before(deadline) {
			return
		}
		// A portal, or the user clicking again, a quarter second later.
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// farmCheck is what the database and the hosts hold once the storm is
// over and every journal is written back.
type farmCheck struct {
	missing     []string // told OK, but no live session of the user on that host in the database, or not on the host
	twoSessions []string // users with more than one live session
	overLimit   []string // hosts with more live sessions than their limit
	misdirected []string // users launching again sent to another host than their session's
	stray       int      // live sessions in the database no host has
	unverified  int      // sessions the database knows only from a host's report
	maxFill     float64  // the fullest host's share of its limit
	journalS    float64  // how long after the storm the last journal was written back
	timelines   []string // what happened to the first few lost and doubled users' launches
}

// verifyFarm waits for the journals to be written back and for the
// agents' reports to reach the database, then compares the database with
// the launches' answers and the hosts.
func verifyFarm(ctx context.Context, f *brokerFarm, dsn string, recs []*launchRec, within time.Duration) (farmCheck, error) {
	var v farmCheck
	t0 := time.Now()
	deadline := t0.Add(within)
	for f.journalsLeft() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	writeback := time.Since(t0).Seconds()
	st, err := store.Connect(dsn, 4)
	if err != nil {
		return v, err
	}
	defer st.Close()
	// The last sessions log on up to two seconds after their answer, and
	// the agents report within a poll and a heartbeat: wait until the
	// database agrees, or the deadline, and report what differs then.
	for {
		v, err = checkFarm(ctx, st, f, recs)
		if err != nil {
			return v, err
		}
		v.journalS = writeback
		// Relaunches sent elsewhere stay two sessions: the rest settles.
		settled := len(v.missing) == 0 && len(v.twoSessions) <= len(v.misdirected) && v.stray == 0
		if settled || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return v, nil
}

func checkFarm(ctx context.Context, st *store.Store, f *brokerFarm, recs []*launchRec) (farmCheck, error) {
	var v farmCheck
	live, err := st.Sessions(ctx, "", false, 1000000)
	if err != nil {
		return v, err
	}
	byUser := map[string][]store.Session{}
	perHost := map[string]int{}
	for _, s := range live {
		byUser[s.User] = append(byUser[s.User], s)
		perHost[s.Host]++
		if s.Unverified {
			v.unverified++
		}
		if h := f.hosts[s.Host]; h == nil || !h.has(s.User) {
			v.stray++
		}
	}
	for u, ss := range byUser {
		if len(ss) > 1 {
			v.twoSessions = append(v.twoSessions, u)
		}
	}
	for name, h := range f.hosts {
		n := max(perHost[name], h.count())
		if n > f.limit {
			v.overLimit = append(v.overLimit, fmt.Sprintf("%s: %d", name, n))
		}
		v.maxFill = max(v.maxFill, float64(n)/float64(f.limit))
	}
	elsewhere := map[string]bool{}
	for _, r := range recs {
		if r.ok && r.wantHost != "" && r.host != r.wantHost {
			v.misdirected = append(v.misdirected, r.user)
			elsewhere[r.user] = true
		}
	}
	for _, r := range recs {
		// A user sent elsewhere on launching again has two sessions:
		// counted as doubled, and not as lost too when the write-back
		// keeps the second one live and ends the record of the first.
		if !r.ok || elsewhere[r.user] {
			continue
		}
		found := false
		for _, s := range byUser[r.user] {
			// A session the database knows only from its host's report
			// is not the placement the user was told of: that was lost.
			found = found || s.Host == r.host && !s.Unverified
		}
		if !found || !f.hosts[r.host].has(r.user) {
			v.missing = append(v.missing, r.user)
		}
	}
	sort.Strings(v.twoSessions)
	sort.Strings(v.missing)
	sort.Strings(v.overLimit)
	return v, nil
}

// has reports whether user has a session on the host.
func (h *simHost) has(user string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.sessions[user]
	return ok
}

// brokerOutcome turns a case's launches and check into its Outcome.
func brokerOutcome(c brokerCase, sc brokerScale, run int, recs []*launchRec, faultAt, faultEnd time.Time, v farmCheck, heldAtKill int) Outcome {
	var unanswered, refusedN, retried, okN, duringFault, affected int
	var lastAffected time.Time
	var maxAnswer time.Duration
	for _, r := range recs {
		if r.ok {
			okN++
			if !r.end.Before(faultAt) && !r.end.After(faultEnd) {
				duringFault++
			}
		}
		if !r.answered {
			unanswered++
		} else if !r.ok {
			refusedN++
		}
		if r.attempts > 1 {
			retried++
		}
		d := r.end.Sub(r.start)
		if !r.end.Before(faultAt) {
			maxAnswer = max(maxAnswer, d)
		}
		if !r.ok || r.attempts > 1 || d > time.Second {
			affected++
			if r.end.After(lastAffected) {
				lastAffected = r.end
			}
		}
	}
	lost := unanswered + len(v.missing)
	doubled := len(v.overLimit)
	users := map[string]bool{}
	for _, u := range append(append([]string(nil), v.twoSessions...), v.misdirected...) {
		users[u] = true
	}
	doubled += len(users)
	relaunches := 0
	for _, r := range recs {
		if r.wantHost != "" {
			relaunches++
		}
	}
	recover := -1.0
	if lastAffected.After(faultAt) {
		recover = lastAffected.Sub(faultAt).Seconds()
	}
	o := Outcome{Scenario: "broker", Case: c.fault, Run: run, Users: len(recs), Affected: affected, RecoverS: recover,
		Load: fmt.Sprintf("launch storm through the HTTP launch API: %g new users/s, up to %d in flight, two brokers round robin, %d hosts × %d sessions",
			sc.rate, sc.inflight, sc.hosts, sc.sessionLimit),
		Metrics: map[string]float64{
			"launches":                float64(len(recs)),
			"launches_ok":             float64(okN),
			"answered_during_fault":   float64(duringFault),
			"fault_s":                 faultEnd.Sub(faultAt).Seconds(),
			"launches_retried":        float64(retried),
			"launches_refused":        float64(refusedN),
			"launches_unanswered":     float64(unanswered),
			"launches_lost":           float64(lost),
			"launches_doubled":        float64(doubled),
			"users_two_sessions":      float64(len(v.twoSessions)),
			"relaunches":              float64(relaunches),
			"launches_held_by_killed": float64(heldAtKill),
			"relaunches_elsewhere":    float64(len(v.misdirected)),
			"hosts_over_limit":        float64(len(v.overLimit)),
			"sessions_stray":          float64(v.stray),
			"records_unverified":      float64(v.unverified),
			"host_fill_max_pct":       100 * v.maxFill,
			"max_answer_s":            maxAnswer.Seconds(),
			"writeback_s":             v.journalS,
		}}
	// With broker.peers, even a user launching again at the broker that
	// did not place their session, every report of it having gone to the
	// other, is sent back to it in an outage: no doubling is excused.
	o.Held = lost == 0 && doubled == 0 && refusedN == 0 && v.stray == 0
	o.Notes = fmt.Sprintf("%d of %d launches answered during the fault; %d needed a second try; longest answer %.1f s.",
		duringFault, len(recs), retried, maxAnswer.Seconds())
	var bad []string
	if len(v.missing) > 0 {
		bad = append(bad, fmt.Sprintf("told OK but not in the database or on the host: %v", v.missing[:min(5, len(v.missing))]))
	}
	if len(v.twoSessions) > 0 {
		bad = append(bad, fmt.Sprintf("two live sessions: %v", v.twoSessions[:min(5, len(v.twoSessions))]))
	}
	if len(v.misdirected) > 0 {
		bad = append(bad, fmt.Sprintf("launched again and sent to another host than their session's: %v", v.misdirected[:min(5, len(v.misdirected))]))
	}
	if len(v.overLimit) > 0 {
		bad = append(bad, fmt.Sprintf("hosts over their limit: %v", v.overLimit[:min(5, len(v.overLimit))]))
	}
	if unanswered > 0 {
		bad = append(bad, fmt.Sprintf("%d launches never answered", unanswered))
	}
	if refusedN > 0 {
		bad = append(bad, fmt.Sprintf("%d launches refused", refusedN))
	}
	if v.stray > 0 {
		bad = append(bad, fmt.Sprintf("%d live sessions in the database that no host has", v.stray))
	}
	for _, b := range bad {
		o.Notes += " " + b + "."
	}
	for _, t := range v.timelines {
		o.Notes += " " + t
	}
	return o
}
