package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/testkit"
)

// eachStore runs fn against a fresh SQLite file and a fresh database on a
// real PostgreSQL server: the same tests prove both dialects.
func eachStore(t *testing.T, fn func(t *testing.T, open func() *store.Store)) {
	eachDSN(t, func(t *testing.T, dsn string) {
		fn(t, func() *store.Store { return openStore(t, dsn) })
	})
}

// eachDSN is eachStore for tests that reach into the database itself.
func eachDSN(t *testing.T, fn func(t *testing.T, dsn string)) {
	t.Run("sqlite", func(t *testing.T) {
		fn(t, filepath.Join(t.TempDir(), "broker.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		fn(t, testkit.StartPostgres(t).NewDB(t))
	})
}

func openStore(t *testing.T, dsn string) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), dsn, 80)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var t0 = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

type fixture struct {
	t *testing.T
	s *store.Store
}

func setup(t *testing.T, s *store.Store, groups ...store.Group) *fixture {
	t.Helper()
	if len(groups) == 0 {
		groups = []store.Group{{Name: "desk", Kind: "pooled", Spread: "breadth"}}
	}
	if err := s.SyncGroups(context.Background(), groups); err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, s: s}
}

func (f *fixture) host(name, group, zone string, limit, logon int) {
	f.t.Helper()
	err := f.s.RegisterHost(context.Background(), store.Host{Name: name, Group: group, Zone: zone, Address: name + ".lan",
		Port: 3389, Weight: 1, SessionLimit: limit, LogonLimit: logon, RegisteredAt: t0})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) launch(user string, mod ...func(*store.Launch)) (store.Placement, error) {
	l := store.Launch{User: user, Group: "desk", SessionID: store.NewID(), Now: t0, Stale: t0.Add(-time.Minute)}
	for _, m := range mod {
		m(&l)
	}
	return f.s.Place(context.Background(), l)
}

func (f *fixture) mustLaunch(user string, mod ...func(*store.Launch)) store.Placement {
	f.t.Helper()
	p, err := f.launch(user, mod...)
	if err != nil {
		f.t.Fatalf("launch for %s: %v", user, err)
	}
	return p
}

// beat applies host's report r as its agent's heartbeat 10 s after t0.
func (f *fixture) beat(host string, r store.Report) {
	f.t.Helper()
	r.Host, r.Now, r.LogonGrace = host, t0.Add(10*time.Second), time.Minute
	if err := f.s.Heartbeat(context.Background(), r); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) hosts() map[string]store.Host {
	f.t.Helper()
	hs, err := f.s.Hosts(context.Background(), "")
	if err != nil {
		f.t.Fatal(err)
	}
	m := map[string]store.Host{}
	for _, h := range hs {
		m[h.Name] = h
	}
	return m
}

func TestMigrationsRunOnceAndReopen(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		s := open()
		setup(t, s).host("h1", "desk", "", 2, 2)
		s.Close()
		s2 := open() // migrations already applied: nothing runs twice, data stays
		hs, err := s2.Hosts(context.Background(), "desk")
		if err != nil || len(hs) != 1 {
			t.Fatalf("after reopen: %v, %d hosts", err, len(hs))
		}
	})
}

func TestPlacementSpreadsAndReconnects(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		f := setup(t, open())
		for _, h := range []string{"h1", "h2", "h3"} {
			f.host(h, "desk", "", 10, 10)
		}
		got := map[string]int{}
		for i := range 6 {
			p := f.mustLaunch(fmt.Sprintf("u%d", i))
			if p.Reconnect {
				t.Fatalf("first launch of u%d is a reconnect", i)
			}
			got[p.Host]++
		}
		// Breadth first: six launches on three empty hosts land two on each.
		for _, h := range []string{"h1", "h2", "h3"} {
			if got[h] != 2 {
				t.Fatalf("breadth-first spread = %v, want 2 on each host", got)
			}
		}
		first := f.mustLaunch("alice")
		again := f.mustLaunch("alice")
		if !again.Reconnect || again.Host != first.Host || again.SessionID != first.SessionID {
			t.Fatalf("relaunch = %+v, want reconnect to %+v", again, first)
		}
		if h := f.hosts()[first.Host]; h.Sessions != 3 || h.Pending != 3 {
			t.Fatalf("host %s counters = %d sessions %d pending, want 3 and 3 (a reconnect takes no slot)", h.Name, h.Sessions, h.Pending)
		}
	})
}

func TestPlacementLimitsDrainHealthAndStaleness(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		f := setup(t, open())
		f.host("full", "desk", "", 1, 5)
		f.mustLaunch("x") // the only host takes one session
		if _, err := f.launch("y"); !errors.Is(err, store.ErrNoHost) {
			t.Fatalf("launch on a full group: %v, want ErrNoHost", err)
		}
		f.host("drained", "desk", "", 5, 5)
		if err := f.s.SetAdminDrain(ctx, "drained", true); err != nil {
			t.Fatal(err)
		}
		f.host("sick", "desk", "", 5, 5)
		if err := f.s.Heartbeat(ctx, store.Report{Host: "sick", DiskIdle: 0.2, Unhealthy: "disk idle 20% < 50%", Now: t0}); err != nil {
			t.Fatal(err)
		}
		f.host("gone", "desk", "", 5, 5)
		if _, err := f.launch("y", func(l *store.Launch) { l.Stale = t0.Add(time.Second) }); !errors.Is(err, store.ErrNoHost) {
			t.Fatalf("launch with only full, draining, unhealthy and stale hosts: %v, want ErrNoHost", err)
		}
		// The heartbeats are at t0: with a cutoff before that, "gone" is reachable.
		if p := f.mustLaunch("y"); p.Host != "gone" {
			t.Fatalf("launch went to %s, want gone (the only eligible host)", p.Host)
		}
		if err := f.s.SetAdminDrain(ctx, "nosuch", true); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("drain of an unknown host: %v", err)
		}
		// Drained hosts still reconnect their users.
		if err := f.s.SetAdminDrain(ctx, "gone", true); err != nil {
			t.Fatal(err)
		}
		if p := f.mustLaunch("y"); !p.Reconnect || p.Host != "gone" {
			t.Fatalf("relaunch onto a draining host = %+v, want a reconnect", p)
		}
	})
}

func TestPlacementLogonToleranceAndEvents(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		f := setup(t, open())
		f.host("h1", "desk", "", 10, 2)
		a, b := f.mustLaunch("a"), f.mustLaunch("b")
		if _, err := f.launch("c"); !errors.Is(err, store.ErrNoHost) {
			t.Fatalf("third launch with logon limit 2: %v, want ErrNoHost", err)
		}
		changed, err := f.s.Event(ctx, store.Event{Host: "h1", Users: []string{"a"}, State: store.Active, Now: t0})
		if err != nil || !changed {
			t.Fatalf("logon event: %v %v", changed, err)
		}
		if h := f.hosts()["h1"]; h.Pending != 1 || h.Sessions != 2 {
			t.Fatalf("after a logon: pending %d sessions %d, want 1 and 2", h.Pending, h.Sessions)
		}
		f.mustLaunch("c")
		for _, e := range []store.Event{{Users: []string{"b"}, State: store.Active}, {Users: []string{"b"}, State: store.Disconnected}, {Users: []string{"b", "a"}, State: store.Ended}} {
			e.Host, e.Now = "h1", t0
			if _, err := f.s.Event(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		if h := f.hosts()["h1"]; h.Pending != 1 || h.Sessions != 1 {
			t.Fatalf("after logoffs: pending %d sessions %d, want 1 and 1", h.Pending, h.Sessions)
		}
		if p := f.mustLaunch("b"); p.Reconnect || p.SessionID == b.SessionID {
			t.Fatalf("launch after logoff = %+v, want a new session", p)
		}
		if changed, _ := f.s.Event(ctx, store.Event{Host: "h1", Users: []string{"a"}, State: store.Ended, Now: t0}); changed {
			t.Fatal("a second logoff changed something")
		}
		_ = a
		if _, err := f.s.Event(ctx, store.Event{Host: "h1", Users: []string{"a"}, State: "launching", Now: t0}); err == nil {
			t.Fatal("event with state launching accepted")
		}
	})
}

func TestPlacementZonesWeightsDepthPersonal(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		f := setup(t, open(),
			store.Group{Name: "desk", Kind: "pooled", Spread: "breadth"},
			store.Group{Name: "deep", Kind: "pooled", Spread: "depth"},
			store.Group{Name: "mine", Kind: "personal", Spread: "breadth"})
		f.host("eu1", "desk", "eu", 2, 5)
		f.host("us1", "desk", "us", 5, 5)
		eu := func(l *store.Launch) { l.Zone = "eu" }
		for i := range 2 {
			if p := f.mustLaunch(fmt.Sprint("e", i), eu); p.Host != "eu1" {
				t.Fatalf("launch preferring eu went to %s", p.Host)
			}
		}
		if p := f.mustLaunch("e2", eu); p.Host != "us1" {
			t.Fatalf("with eu full the launch went to %s, want the fallback us1", p.Host)
		}
		f.host("d1", "deep", "", 3, 5)
		f.host("d2", "deep", "", 3, 5)
		deep := func(l *store.Launch) { l.Group, l.Depth = "deep", true }
		first := f.mustLaunch("p0", deep)
		for i := 1; i < 3; i++ {
			if p := f.mustLaunch(fmt.Sprint("p", i), deep); p.Host != first.Host {
				t.Fatalf("depth-first launch %d went to %s, want %s filled first", i, p.Host, first.Host)
			}
		}
		if p := f.mustLaunch("p3", deep); p.Host == first.Host {
			t.Fatal("depth-first overfilled a host")
		}
		f.host("m1", "mine", "", 5, 5)
		f.host("m2", "mine", "", 5, 5)
		mine := func(l *store.Launch) { l.Group, l.Personal = "mine", true }
		a := f.mustLaunch("ann", mine)
		b := f.mustLaunch("bob", mine)
		if a.Host == b.Host {
			t.Fatalf("two users share personal host %s", a.Host)
		}
		if _, err := f.launch("cat", mine); !errors.Is(err, store.ErrNoHost) {
			t.Fatalf("third user with two personal hosts: %v, want ErrNoHost", err)
		}
		if _, err := f.s.Event(context.Background(), store.Event{Host: a.Host, Users: []string{"ann"}, State: store.Ended, Now: t0}); err != nil {
			t.Fatal(err)
		}
		if p := f.mustLaunch("ann", mine); p.Host != a.Host || p.Reconnect {
			t.Fatalf("ann's next launch = %+v, want a new session on her own host %s", p, a.Host)
		}
	})
}

func TestHeartbeatReconciles(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		f := setup(t, open())
		f.host("h1", "desk", "", 10, 10)
		f.mustLaunch("gone")   // logged on, then its session vanished from the host
		f.mustLaunch("slow")   // launched but never arrived
		f.mustLaunch("recent") // launched a moment ago
		if _, err := f.s.Event(ctx, store.Event{Host: "h1", Users: []string{"gone"}, State: store.Active, Now: t0}); err != nil {
			t.Fatal(err)
		}
		rep := store.Report{Host: "h1", CPU: 0.5, Mem: 0.25, DiskIdle: 0.9, Now: t0.Add(10 * time.Second),
			LogonGrace: 5 * time.Second, Sessions: map[string]string{"direct": store.Disconnected, "recent": store.Active}}
		// "recent" is within its grace: give it a later creation by launching now.
		if err := f.s.Heartbeat(ctx, rep); err != nil {
			t.Fatal(err)
		}
		live, err := f.s.Sessions(ctx, "", false, 100)
		if err != nil {
			t.Fatal(err)
		}
		states := map[string]string{}
		for _, s := range live {
			states[s.User] = s.State
		}
		want := map[string]string{"direct": store.Disconnected, "recent": store.Active}
		if fmt.Sprint(states) != fmt.Sprint(want) {
			t.Fatalf("live sessions after reconcile = %v, want %v", states, want)
		}
		h := f.hosts()["h1"]
		if h.Sessions != 2 || h.Pending != 0 || h.CPU != 0.5 || h.Mem != 0.25 {
			t.Fatalf("host after reconcile = %+v", h)
		}
		if err := f.s.Heartbeat(ctx, store.Report{Host: "nosuch", Now: t0}); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("heartbeat for an unknown host: %v", err)
		}
	})
}

// TestConcurrentLaunches fires many launches at once, each user twice, at
// hosts with fewer slots than users, and checks what the database holds
// afterwards: no host over its limit, no user with two live sessions, every
// success backed by a row, counters equal to the rows.
func TestConcurrentLaunches(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		f := setup(t, s)
		const hosts, limit, logon, users = 6, 7, 4, 60
		for i := range hosts {
			f.host(fmt.Sprint("h", i), "desk", "", limit, logon)
		}
		type result struct {
			user string
			p    store.Placement
			err  error
		}
		results := make(chan result, 2*users)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 2 * users {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				u := fmt.Sprint("u", i%users)
				p, err := f.launch(u)
				results <- result{u, p, err}
			}()
		}
		close(start)
		wg.Wait()
		close(results)
		placed := map[string]string{}
		ok := 0
		for r := range results {
			switch {
			case errors.Is(r.err, store.ErrNoHost):
			case r.err != nil:
				t.Fatalf("launch for %s: %v", r.user, r.err)
			default:
				ok++
				if prev, seen := placed[r.user]; seen && prev != r.p.SessionID {
					t.Fatalf("user %s got two sessions: %s and %s", r.user, prev, r.p.SessionID)
				}
				placed[r.user] = r.p.SessionID
			}
		}
		// Logon tolerance caps each host at `logon` until someone logs on.
		if len(placed) != hosts*logon {
			t.Fatalf("%d users placed, want %d (every host filled to its logon limit)", len(placed), hosts*logon)
		}
		live, err := s.Sessions(ctx, "", false, 1000)
		if err != nil {
			t.Fatal(err)
		}
		perHost := map[string]int{}
		for _, ss := range live {
			if placed[ss.User] != ss.ID {
				t.Fatalf("live session %s of %s was never returned to a launch", ss.ID, ss.User)
			}
			perHost[ss.Host]++
		}
		if len(live) != len(placed) {
			t.Fatalf("%d live sessions for %d placed users", len(live), len(placed))
		}
		for name, h := range f.hosts() {
			if h.Sessions != perHost[name] || h.Pending != perHost[name] || h.Pending > logon {
				t.Fatalf("host %s: counters %d/%d, rows %d, logon limit %d", name, h.Sessions, h.Pending, perHost[name], logon)
			}
		}
		// Now everyone logs on and a second wave fills the session limits.
		for _, ss := range live {
			if _, err := s.Event(ctx, store.Event{Host: ss.Host, Users: []string{ss.User}, State: store.Active, Now: t0}); err != nil {
				t.Fatal(err)
			}
		}
		var mu sync.Mutex
		more := 0
		for i := range 3 * users {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for try := 0; ; try++ {
					p, err := f.launch(fmt.Sprint("w", i))
					if errors.Is(err, store.ErrNoHost) {
						if try > 50 {
							return // the group is full
						}
						time.Sleep(10 * time.Millisecond) // or every host is at its logon limit for a moment
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					more++
					mu.Unlock()
					// Log on at once so the logon limit does not stop the wave.
					if _, err := s.Event(ctx, store.Event{Host: p.Host, Users: []string{fmt.Sprint("w", i)}, State: store.Active, Now: t0}); err != nil {
						t.Error(err)
					}
					return
				}
			}()
		}
		wg.Wait()
		total := 0
		for name, h := range f.hosts() {
			if h.Sessions > limit {
				t.Fatalf("host %s holds %d sessions over its limit %d", name, h.Sessions, limit)
			}
			total += h.Sessions
		}
		if total != hosts*limit {
			t.Fatalf("%d sessions on %d slots, want every slot used and none twice", total, hosts*limit)
		}
		var rows int
		if err := countLive(s, &rows); err != nil {
			t.Fatal(err)
		}
		if rows != total {
			t.Fatalf("host counters say %d sessions, rows say %d", total, rows)
		}
		t.Logf("%s: first wave %d placed of %d launches, second wave %d more, %d of %d slots used", s.Dialect(), ok, 2*users, more, total, hosts*limit)
	})
}

func countLive(s *store.Store, n *int) error {
	live, err := s.Sessions(context.Background(), "", false, 100000)
	*n = len(live)
	return err
}

// TestAuditTrail: actions are kept with who, what, when, from where and
// the answer, and read newest first, on both databases.
func TestAuditTrail(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		s := open()
		ctx := context.Background()
		base := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
		for i, a := range []string{"POST /api/v1/broker/hosts/h1/drain", "DELETE /api/v1/broker/hosts/h2", "POST /api/v1/reload"} {
			if err := s.RecordAudit(ctx, store.AuditRecord{At: base.Add(time.Duration(i) * time.Second), Actor: "admin token 1",
				Action: a, Source: "192.0.2.7:5100", Status: 200 + i}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.Audit(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Action != "POST /api/v1/reload" || got[0].Status != 202 || !got[0].At.Equal(base.Add(2*time.Second)) ||
			got[1].Action != "DELETE /api/v1/broker/hosts/h2" || got[1].Actor != "admin token 1" || got[1].Source != "192.0.2.7:5100" {
			t.Fatalf("audit trail: %+v", got)
		}
	})
}
