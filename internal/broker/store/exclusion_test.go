package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/store"
)

// TestEachExclusionAlone: for every reason a host takes no new session, a
// group of two hosts where the excluded one ("bad") would otherwise win
// (it is emptier, or fuller under depth-first): the launch goes to the
// other ("ok") in the SQL of both databases and in Pick over the same
// hosts, and Pick with only that reason lifted chooses "bad", which shows
// the case tests the reason and nothing else.
func TestEachExclusionAlone(t *testing.T) {
	type exclusion struct {
		name  string
		depth bool
		// badLimit and badLogon are bad's session and logon limits; bad
		// takes one session first when preload is set.
		badLimit, badLogon int
		preload            bool
		exclude            func(ctx context.Context, s *store.Store, bad string) error
		lift               func(h *store.Host, l store.Launch)
		stale              bool // ok reports after the launch's cutoff, bad before it
	}
	beat := func(ctx context.Context, s *store.Store, r store.Report) error {
		r.DiskIdle, r.LogonGrace = 1, time.Hour
		if r.Now.IsZero() {
			r.Now = t0
		}
		return s.Heartbeat(ctx, r)
	}
	cases := []exclusion{
		{name: "admin-drain", badLimit: 10, badLogon: 10,
			exclude: func(ctx context.Context, s *store.Store, bad string) error { return s.SetAdminDrain(ctx, bad, true) },
			lift:    func(h *store.Host, _ store.Launch) { h.AdminDrain = false }},
		{name: "agent-drain", badLimit: 10, badLogon: 10,
			exclude: func(ctx context.Context, s *store.Store, bad string) error {
				return beat(ctx, s, store.Report{Host: bad, Drain: true})
			},
			lift: func(h *store.Host, _ store.Launch) { h.AgentDrain = false }},
		{name: "unhealthy", badLimit: 10, badLogon: 10,
			exclude: func(ctx context.Context, s *store.Store, bad string) error {
				return beat(ctx, s, store.Report{Host: bad, Unhealthy: "disk idle 20% < 50%"})
			},
			lift: func(h *store.Host, _ store.Launch) { h.Unhealthy = "" }},
		{name: "stale", badLimit: 10, badLogon: 10, stale: true,
			exclude: func(context.Context, *store.Store, string) error { return nil },
			lift:    func(h *store.Host, l store.Launch) { h.LastSeen = l.Stale }},
		// Depth-first prefers the fuller host: bad at 1/1 over ok at 1/10.
		{name: "session-limit", depth: true, badLimit: 1, badLogon: 5, preload: true,
			exclude: func(context.Context, *store.Store, string) error { return nil },
			lift:    func(h *store.Host, _ store.Launch) { h.SessionLimit = 2 }},
		// bad at 1/5 outranks ok at 1/10 under depth-first, but its one
		// logon in progress is its limit.
		{name: "logon-limit", depth: true, badLimit: 5, badLogon: 1, preload: true,
			exclude: func(context.Context, *store.Store, string) error { return nil },
			lift:    func(h *store.Host, _ store.Launch) { h.LogonLimit = 2 }},
	}
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		var groups []store.Group
		for _, c := range cases {
			groups = append(groups, store.Group{Name: c.name, Kind: "pooled", Spread: "breadth"})
		}
		f := setup(t, s, groups...)
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				ok, bad := c.name+"-ok", c.name+"-bad"
				launch := func(user string) store.Launch {
					return store.Launch{User: user, Group: c.name, Depth: c.depth, SessionID: store.NewID(), Now: t0, Stale: t0.Add(-time.Minute)}
				}
				register := func(name string, limit, logon int) {
					t.Helper()
					if err := s.RegisterHost(ctx, store.Host{Name: name, Group: c.name, Address: name + ".lan", Port: 3389,
						Weight: 1, SessionLimit: limit, LogonLimit: logon, RegisteredAt: t0}); err != nil {
						t.Fatal(err)
					}
				}
				if c.preload {
					register(bad, c.badLimit, c.badLogon)
					if p, err := s.Place(ctx, launch("pre-bad")); err != nil || p.Host != bad {
						t.Fatalf("preload of bad: %+v %v", p, err)
					}
				}
				register(ok, 10, 10)
				if p, err := s.Place(ctx, launch("pre-ok")); err != nil || p.Host != ok {
					t.Fatalf("preload of ok: %+v %v", p, err)
				}
				if !c.preload {
					register(bad, c.badLimit, c.badLogon)
				}
				if err := c.exclude(ctx, s, bad); err != nil {
					t.Fatal(err)
				}
				l := launch("u")
				if c.stale {
					if err := beat(ctx, s, store.Report{Host: ok, Now: t0.Add(2 * time.Minute)}); err != nil {
						t.Fatal(err)
					}
					l.Stale = t0.Add(time.Minute)
				}
				hosts, err := s.Hosts(ctx, c.name)
				if err != nil || len(hosts) != 2 {
					t.Fatalf("hosts: %d %v", len(hosts), err)
				}
				rnd := rand.New(rand.NewPCG(1, 2))
				if h, found := broker.Pick(hosts, l, rnd); !found || h.Name != ok {
					t.Fatalf("Pick chose %q (found %v), want %s", h.Name, found, ok)
				}
				lifted := append([]store.Host(nil), hosts...)
				for i := range lifted {
					if lifted[i].Name == bad {
						c.lift(&lifted[i], l)
					}
				}
				if h, _ := broker.Pick(lifted, l, rnd); h.Name != bad {
					t.Fatalf("with the exclusion lifted Pick chose %q, not %s: the case does not test the exclusion", h.Name, bad)
				}
				p, err := f.s.Place(ctx, l)
				if err != nil || p.Host != ok {
					t.Fatalf("the database placed on %q (%v), want %s", p.Host, err, ok)
				}
			})
		}
	})
}

// TestPickAgreesWithTheDatabase walks a group through random changes
// (hosts joining with random limits, weights and zones, drains, health
// and load reports, hosts falling silent) and launches, and at every
// launch checks that the database places it on a host Pick would choose
// over the same hosts, and refuses it exactly when Pick finds none.
func TestPickAgreesWithTheDatabase(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		setup(t, s)
		rnd := rand.New(rand.NewPCG(7, 11))
		now := t0
		var names []string
		type placed struct{ user, host string }
		var sessions []placed
		launches, refused := 0, 0
		for step := range 400 {
			now = now.Add(10 * time.Second)
			switch k := rnd.IntN(10); {
			case k == 0 || len(names) < 2:
				name := fmt.Sprintf("h%d", len(names))
				zone := []string{"a", "b"}[rnd.IntN(2)]
				if err := s.RegisterHost(ctx, store.Host{Name: name, Group: "desk", Zone: zone, Address: name + ".lan", Port: 3389,
					Weight: float64(1 + rnd.IntN(2)), SessionLimit: 1 + rnd.IntN(6), LogonLimit: 1 + rnd.IntN(3), RegisteredAt: now}); err != nil {
					t.Fatal(err)
				}
				names = append(names, name)
			case k == 1:
				if err := s.SetAdminDrain(ctx, names[rnd.IntN(len(names))], rnd.IntN(3) == 0); err != nil {
					t.Fatal(err)
				}
			case k == 2 && len(sessions) > 0:
				// A logon completes, freeing a logon slot of its host.
				ps := sessions[rnd.IntN(len(sessions))]
				if _, err := s.Event(ctx, store.Event{Host: ps.host, Users: []string{ps.user}, State: store.Active, Now: now}); err != nil {
					t.Fatal(err)
				}
			case k <= 4:
				r := store.Report{Host: names[rnd.IntN(len(names))], CPU: rnd.Float64(), Mem: rnd.Float64() * 0.5,
					DiskIdle: 1, Drain: rnd.IntN(6) == 0, Now: now, LogonGrace: 24 * time.Hour}
				if rnd.IntN(6) == 0 {
					r.Unhealthy = "memory pressure 40% > 20%"
				}
				if err := s.Heartbeat(ctx, r); err != nil {
					t.Fatal(err)
				}
			default:
				l := store.Launch{User: fmt.Sprintf("u%d", step), Group: "desk", Zone: []string{"a", "b"}[rnd.IntN(2)],
					Depth: rnd.IntN(2) == 0, SessionID: store.NewID(), Now: now, Stale: now.Add(-time.Minute)}
				hosts, err := s.Hosts(ctx, "desk")
				if err != nil {
					t.Fatal(err)
				}
				// Pick breaks ties by chance: the hosts it chooses over many
				// draws are the tied best.
				best := map[string]bool{}
				for seed := range uint64(64) {
					if h, found := broker.Pick(hosts, l, rand.New(rand.NewPCG(seed, 3))); found {
						best[h.Name] = true
					}
				}
				p, err := s.Place(ctx, l)
				switch {
				case len(best) == 0 && !errors.Is(err, store.ErrNoHost):
					t.Fatalf("step %d: Pick finds no host, the database placed on %q (%v)\nhosts: %+v", step, p.Host, err, hosts)
				case len(best) > 0 && err != nil:
					t.Fatalf("step %d: Pick chooses %v, the database refused: %v\nhosts: %+v", step, best, err, hosts)
				case len(best) > 0 && !best[p.Host]:
					t.Fatalf("step %d: the database placed on %s, Pick chooses %v\nhosts: %+v", step, p.Host, best, hosts)
				}
				if err != nil {
					refused++
				} else {
					launches++
					sessions = append(sessions, placed{l.User, p.Host})
				}
			}
		}
		if launches < 50 || refused < 10 {
			t.Fatalf("%d launches placed and %d refused: the walk did not cover both", launches, refused)
		}
	})
}

// TestRestore: sessions a broker placed from its local cache while the
// database was down are written back; one that would give its user a
// second live session (another broker placed them meanwhile) is kept as
// ended, a personal group's host is assigned to its user, the hosts are
// recounted, and writing the same journal back twice changes nothing.
func TestRestore(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		f := setup(t, s, store.Group{Name: "desk", Kind: "pooled", Spread: "breadth"}, store.Group{Name: "mine", Kind: "personal", Spread: "breadth"})
		f.host("h1", "desk", "", 10, 10)
		f.host("p1", "mine", "", 1, 1)
		other := f.mustLaunch("u2") // another broker placed u2 while this one was offline
		offline := func(id, user, group, host string) store.Session {
			return store.Session{ID: id, User: user, Group: group, Host: host, State: store.Launching, CreatedAt: t0, UpdatedAt: t0}
		}
		journal := []store.Session{offline("s1", "u1", "desk", "h1"), offline("s2", "u2", "desk", "h1"), offline("s3", "u3", "mine", "p1")}
		for round := range 2 {
			live, err := s.Restore(ctx, journal, map[string]bool{"mine": true})
			if want := []int{2, 0}[round]; err != nil || live != want {
				t.Fatalf("restore %d: %d live, %v; want %d", round+1, live, err, want)
			}
			hs := f.hosts()
			if hs["h1"].Sessions != 2 || hs["p1"].Sessions != 1 || hs["p1"].AssignedUser != "u3" {
				t.Fatalf("restore %d: h1 %d sessions, p1 %d sessions assigned to %q; want 2, 1 and u3",
					round+1, hs["h1"].Sessions, hs["p1"].Sessions, hs["p1"].AssignedUser)
			}
		}
		all, err := s.Sessions(ctx, "u2", true, 10)
		if err != nil || len(all) != 2 {
			t.Fatalf("u2's sessions: %+v %v", all, err)
		}
		for _, ss := range all {
			if ss.ID == "s2" && ss.State != store.Ended {
				t.Fatalf("the conflicting offline session is %s, want ended", ss.State)
			}
			if ss.ID == other.SessionID && ss.State == store.Ended {
				t.Fatal("the session the other broker placed was ended")
			}
		}
		if p := f.mustLaunch("u1"); !p.Reconnect || p.SessionID != "s1" || p.Host != "h1" {
			t.Fatalf("u1 relaunch = %+v, want a reconnect to s1", p)
		}
		if p := f.mustLaunch("u3", func(l *store.Launch) { l.Group, l.Personal = "mine", true }); !p.Reconnect || p.SessionID != "s3" {
			t.Fatalf("u3 relaunch = %+v, want a reconnect to s3", p)
		}
	})
}
