package ha

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// One holder at a time: the other takes the lease once it has expired
// by the database's clock, or at once when its holder released it, and
// a holder that lost it cannot renew it.
func TestLeaseOneHolder(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	ctx := context.Background()
	const ttl = 500 * time.Millisecond
	open := func(node string) *Lease {
		l, err := Open(ctx, dsn, "pair", node, ttl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		if err := l.prepare(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := open("gw-1"), open("gw-2")
	acquire := func(l *Lease) (bool, Previous, string) {
		t.Helper()
		held, prev, holder, err := l.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return held, prev, holder
	}
	if held, prev, _ := acquire(a); !held || prev != (Previous{}) {
		t.Fatalf("gw-1 on a free lease: held %v, previous %+v", held, prev)
	}
	if held, _, holder := acquire(b); held || holder != "gw-1" {
		t.Fatalf("gw-2 while gw-1 holds it: held %v, holder %q", held, holder)
	}
	if held, prev, _ := acquire(a); !held || prev != (Previous{Holder: "gw-1"}) {
		t.Fatalf("gw-1 renewing: held %v, previous %+v", held, prev)
	}
	var prev Previous
	deadline := time.Now().Add(5 * ttl)
	for held := false; !held; {
		if time.Now().After(deadline) {
			t.Fatal("gw-2 never took the lease gw-1 stopped renewing")
		}
		held, prev, _ = acquire(b)
	}
	if prev != (Previous{Holder: "gw-1"}) {
		t.Fatalf("gw-2 took the lease from %+v; want gw-1's, expired", prev)
	}
	if held, _, holder := acquire(a); held || holder != "gw-2" {
		t.Fatalf("gw-1 renewing a lease gw-2 took: held %v, holder %q", held, holder)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if held, _, _ := acquire(a); held {
		t.Fatal("gw-1's release freed gw-2's lease")
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if held, prev, _ := acquire(a); !held || prev != (Previous{Holder: "gw-2", Released: true}) {
		t.Fatalf("gw-1 after gw-2 released: held %v, previous %+v", held, prev)
	}
}

// recorder counts an elector's actions.
type recorder struct {
	mu                sync.Mutex
	promoted, demoted []time.Time
}

func (r *recorder) Promote() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.promoted = append(r.promoted, time.Now())
	return nil
}

func (r *recorder) Refresh() error { return nil }

func (r *recorder) Demote() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.demoted = append(r.demoted, time.Now())
}

func (r *recorder) counts() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.promoted), len(r.demoted)
}

// An active gateway cut off from the database gives its role up before
// its lease can expire: within the lease of the database going.
func TestElectorDemotesWithoutDatabase(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	const ttl = 900 * time.Millisecond
	rec := &recorder{}
	e, err := New(context.Background(), Options{DSN: dsn, Group: "pair", Node: "gw-1", TTL: ttl}, rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wait := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(within); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waited %v for %s", within, what)
			}
		}
	}
	wait("the promotion", 10*time.Second, func() bool { p, _ := rec.counts(); return p == 1 })
	if s := e.Status(); s.Role != "active" || s.Holder != "gw-1" {
		t.Fatalf("status after the promotion: %+v", s)
	}
	lost := time.Now()
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait("the demotion", 3*ttl, func() bool { _, d := rec.counts(); return d == 1 })
	rec.mu.Lock()
	took := rec.demoted[0].Sub(lost)
	rec.mu.Unlock()
	t.Logf("demoted %v after the database went", took.Round(time.Millisecond))
	if took > ttl {
		t.Fatalf("demoted %v after the database went: after the lease (%v) could have expired", took, ttl)
	}
	if s := e.Status(); s.Role != "passive" {
		t.Fatalf("status after the demotion: %+v", s)
	}
}
