package broker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/testkit"
)

// TestLogonEventAtTheOtherBrokerBeforeAnOutage is the other way the
// broker scenario gave a user two sessions: broker A placed u1 just
// before PostgreSQL stopped; the host's report of the logon reached
// broker B, whose database took it but whose copy, which reloads the
// other brokers' sessions once a minute, did not; the host's heartbeats
// went to A. u1 then launched again at B during the outage, and B,
// placing from its copy, gave them a second session. A logon B's
// database takes for a session B's copy lacks must bring that session
// into the copy, as a heartbeat naming it does.
func TestLogonEventAtTheOtherBrokerBeforeAnOutage(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := twoBrokers(t, dsn)
	first := a.launch(t, "u1")
	b.host["u1"] = first.Host
	b.event(t, "u1", store.Active)
	// No cache refresh runs before the launch at B: Maintain starts
	// with the outage.
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	maintain(t, ctx, a.r.b)
	maintain(t, ctx, b.r.b)
	second := b.launch(t, "u1")
	if !second.Reconnect || second.Host != first.Host || second.SessionID != first.SessionID {
		t.Fatalf("u1 placed by A on %s as %s, its logon reported to B, launched again at B in an outage: reconnect %t, session %q on %s; want a reconnect to %s",
			first.Host, first.SessionID, second.Reconnect, second.SessionID, second.Host, first.SessionID)
	}
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*world{a, b} {
		if got := w.settled(t); got["u1"] != store.Active {
			t.Errorf("%s: u1's live sessions after the outage: %v, want one, active", w.name, got)
		}
	}
}

// TestOutageLogonEventAtTheOtherBroker is how `deskway bench faults
// --scenario broker` gave users two sessions while PostgreSQL was down:
// broker A placed u1 on a host; the host's report of the logon went,
// through the load balancer in front of the brokers, to broker B, which
// dropped it because its copy had no session of u1 there; u1 then
// launched again at B, before a heartbeat of that host had reached B,
// and B placed a second session. A logon reported to either broker must
// send the user's next launch there back to that session, and the
// write-back leave u1 one live session.
func TestOutageLogonEventAtTheOtherBroker(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := twoBrokers(t, dsn)
	maintain(t, ctx, a.r.b)
	maintain(t, ctx, b.r.b)
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := a.launch(t, "u1")
	// The host reports the logon to B (its heartbeats, naming u1, go to
	// A: none reaches B here).
	b.host["u1"] = first.Host
	b.event(t, "u1", store.Active)
	second := b.launch(t, "u1")
	if !second.Reconnect || second.Host != first.Host {
		t.Fatalf("u1 logged on to %s (placed by A, the logon reported to B), launched again at B: reconnect %t, session %q on %s; want a reconnect to %s",
			first.Host, second.Reconnect, second.SessionID, second.Host, first.Host)
	}
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.id["u1"] = first.SessionID
	for _, w := range []*world{a, b} {
		got := w.settled(t)
		if _, ok := got["u1"]; !ok {
			t.Errorf("%s: u1 has no live session after the write-back: %v", w.name, got)
		}
	}
	all, err := a.r.store.Sessions(context.Background(), "u1", true, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].ID != first.SessionID || all[0].Host != first.Host {
		t.Errorf("u1's sessions after the write-back: %+v, want only %s on %s", all, first.SessionID, first.Host)
	}
}

// twoBrokers starts brokers A and B on one database, with hosts h1 and h2
// registered at A and B holding their credentials too, so either broker
// hears both hosts.
func twoBrokers(t *testing.T, dsn string) (a, b *world) {
	t.Helper()
	a = newWorld(t, "broker A", dsn, []string{"h1", "h2"})
	b = newWorld(t, "broker B", dsn, nil) // starts with h1 and h2 in its copy
	for h, cred := range a.creds {
		b.creds[h] = cred
	}
	return a, b
}

// TestOutageStaleReportInTheLogonsMillisecond is how `deskway bench
// faults --scenario link` lost a launch: broker B placed u1 just before
// the link to PostgreSQL was cut. The host's agent, held by a heartbeat
// the cut stalled, then sent B a heartbeat with its reading from before
// u1's logon, and A the logon right after, both stamped within one
// millisecond. A's journal was written back first: u1's session active,
// updated at that millisecond. B's replayed heartbeat, made a fraction
// of that millisecond earlier, passed for newer than the record, which
// keeps milliseconds, and ended the session u1 was logged on to; the
// host's next report stored it again as one no broker placed. Nor may
// such a report bring back u2, who logged off in that millisecond, as a
// session no broker placed.
func TestOutageStaleReportInTheLogonsMillisecond(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clock := &pinClock{}
	a := newWorldOn(t, "broker A", dsn, []string{"h1", "h2"}, rigNet{now: clock.now}, nil)
	b := newWorldOn(t, "broker B", dsn, nil, rigNet{now: clock.now}, nil)
	for h, cred := range a.creds {
		b.creds[h] = cred
	}
	placed := b.launch(t, "u1")
	left := b.launch(t, "u2")
	b.event(t, "u2", store.Active)
	b.host["u2"] = left.Host // B's model keeps u2 on its host: the reports below are from before the logoff
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Truncate(time.Millisecond).Add(200 * time.Microsecond)
	clock.pin(at)
	// The readings from before u1's logon and u2's logoff.
	for _, h := range []string{placed.Host, left.Host} {
		b.beat(t, h, map[string]string{"u1": store.Launching, "u2": store.Active})
	}
	clock.pin(at.Add(600 * time.Microsecond))
	a.host["u1"], a.id["u1"] = placed.Host, placed.SessionID
	a.host["u2"], a.id["u2"] = left.Host, left.SessionID
	a.event(t, "u1", store.Active)
	a.event(t, "u2", store.Ended)
	clock.unpin()
	delete(b.host, "u2")
	delete(b.id, "u2")
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A writes back first; B, still offline, after.
	maintain(t, ctx, a.r.b)
	if got := a.settled(t); got["u1"] != store.Active || got["u2"] != "" {
		t.Fatalf("after A's write-back the live sessions are %v, want u1's, active, and none of u2", got)
	}
	maintain(t, ctx, b.r.b)
	if got := b.settled(t); got["u1"] != store.Active || got["u2"] != "" {
		t.Errorf("after B's write-back the live sessions are %v, want u1's, active, and none of u2", got)
	}
	all, err := a.r.store.Sessions(context.Background(), "u1", true, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].ID != placed.SessionID || all[0].State != store.Active {
		t.Errorf("u1's sessions after both write-backs: %+v, want only %s, active", all, placed.SessionID)
	}
}

// pinClock is the brokers' clock: the time, or the instant a test pins
// it to.
type pinClock struct{ pinned atomic.Pointer[time.Time] }

func (c *pinClock) now() time.Time {
	if p := c.pinned.Load(); p != nil {
		return *p
	}
	return time.Now()
}

func (c *pinClock) pin(at time.Time) { c.pinned.Store(&at) }

func (c *pinClock) unpin() { c.pinned.Store(nil) }
