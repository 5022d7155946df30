package broker_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// TestLaunchAtTheBrokerBackFirst is how `deskway bench faults --scenario
// broker` last gave a user two sessions: both brokers placed from their
// copies while PostgreSQL was stopped; B placed u1 half a second before
// it came back; A tried the database first and went back to it, while B
// still held u1's placement in its journal (each broker tries every
// 5 s); u1 logged on, the logon and the host's heartbeats reached A,
// whose database recorded the session as one no broker placed
// (unverified, so it draws no launch); u1 launched again at A, which
// placed a second session in the database. Here B's write-back is held
// back (its maintenance loop runs only at the end). A, back on the
// database with a peer that has not written back, asks it first and
// sends u1 back to B's placement, which ends up in the database once.
// The reverse is run too: u3 placed by A in the database while B is
// still away from it, then launched again at B.
func TestLaunchAtTheBrokerBackFirst(t *testing.T) {
	pg := testkit.StartPostgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := peerBrokers(t, pg.NewDB(t))
	if err := pg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	a.launch(t, "u2")
	first := b.launch(t, "u1")
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	maintain(t, ctx, a.r.b)
	backOnDatabase(t, a)

	// u1 logs on at the host B named; A hears of it.
	a.host["u1"], a.id["u1"] = first.Host, first.SessionID
	a.event(t, "u1", store.Active)
	a.beat(t, first.Host, map[string]string{"u1": store.Active, "u2": store.Launching})
	rec, err := a.r.store.Sessions(ctx, "u1", true, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec) != 1 || !rec[0].Unverified || rec[0].Host != first.Host {
		t.Fatalf("u1's records after A heard of the logon: %+v, want one unverified on %s (the bench's timeline)", rec, first.Host)
	}

	second := a.launch(t, "u1")
	if !second.Reconnect || second.Host != first.Host || second.SessionID != first.SessionID {
		t.Fatalf("u1 placed by B in the outage as %s on %s, not written back, launched again at A back on the database: reconnect %t, session %q on %s; want a reconnect to %s on %s",
			first.SessionID, first.Host, second.Reconnect, second.SessionID, second.Host, first.SessionID, first.Host)
	}

	// The reverse: B is still away from the database.
	third := a.launch(t, "u3")
	again := b.launch(t, "u3")
	if !again.Reconnect || again.Host != third.Host || again.SessionID != third.SessionID {
		t.Fatalf("u3 placed by A in the database as %s on %s, launched again at B, still away from it: reconnect %t, session %q on %s; want a reconnect",
			third.SessionID, third.Host, again.Reconnect, again.SessionID, again.Host)
	}

	maintain(t, ctx, b.r.b)
	b.host["u2"], b.id["u2"] = a.host["u2"], a.id["u2"]
	b.settled(t)
	b.beat(t, first.Host, map[string]string{"u1": store.Active, "u2": store.Launching, "u3": store.Launching})
	wantOneLiveU1(t, ctx, first.SessionID, a, b)

	// B has written back: A asks it once more, then no more.
	a.launch(t, "u4")
	asked := peerQuestions(t, a.r, "none")
	a.launch(t, "u5")
	if got := peerQuestions(t, a.r, "none"); got != asked {
		t.Errorf("A asked B %v more times after B said it had written back", got-asked)
	}
	if !strings.Contains(a.r.logs.String(), "a peer broker has written back") {
		t.Errorf("A's log does not say B has written back:\n%s", a.r.logs.String())
	}
}

// TestLaunchAtTheBrokerThatKeptTheDatabase: only B's link to PostgreSQL
// is cut; A never loses the database, so it has no return to settle
// after. B places u1 from its copy, asking A first, as it does before
// every placement in an outage; that question says B is away from the
// database, and A, until B says it has written back, asks B before
// placing a user. u1 logs on, A hears of it (an unverified record), u1
// launches again at A and goes back to B's placement.
func TestLaunchAtTheBrokerThatKeptTheDatabase(t *testing.T) {
	pg := testkit.StartPostgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dsn := pg.NewDB(t)
	link := newDBLink(t, pg.Addr())
	a, b := peerBrokersOn(t, dsn, strings.Replace(dsn, pg.Addr(), link.addr(), 1))
	link.set(false)
	first := b.launch(t, "u1")
	if !strings.Contains(b.r.logs.String(), "database unreachable") {
		t.Fatalf("B placed u1 with its link to the database cut, but does not say it is unreachable:\n%s", b.r.logs.String())
	}
	a.host["u1"], a.id["u1"] = first.Host, first.SessionID
	a.event(t, "u1", store.Active)
	a.beat(t, first.Host, map[string]string{"u1": store.Active})
	second := a.launch(t, "u1")
	if !second.Reconnect || second.Host != first.Host || second.SessionID != first.SessionID {
		t.Fatalf("u1 placed by B, cut off from the database, as %s on %s, launched again at A, which kept it: reconnect %t, session %q on %s; want a reconnect to %s on %s",
			first.SessionID, first.Host, second.Reconnect, second.SessionID, second.Host, first.SessionID, first.Host)
	}
	link.set(true)
	maintain(t, ctx, b.r.b)
	wantOneLiveU1(t, ctx, first.SessionID, a, b)
}

// dbLink is a TCP relay to PostgreSQL that a test cuts and mends: one
// broker's link to the database, the others' staying up. Cut, it closes
// the connections it relays and every new one.
type dbLink struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	up     bool
	conns  []net.Conn
}

func newDBLink(t *testing.T, target string) *dbLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &dbLink{ln: ln, target: target, up: true}
	t.Cleanup(func() {
		ln.Close()
		l.set(false)
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go l.relay(c)
		}
	}()
	return l
}

func (l *dbLink) addr() string { return l.ln.Addr().String() }

func (l *dbLink) relay(c net.Conn) {
	l.mu.Lock()
	if !l.up {
		l.mu.Unlock()
		c.Close()
		return
	}
	l.mu.Unlock()
	s, err := net.Dial("tcp", l.target)
	if err != nil {
		c.Close()
		return
	}
	l.mu.Lock()
	if !l.up {
		l.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	l.conns = append(l.conns, c, s)
	l.mu.Unlock()
	go func() {
		_, _ = io.Copy(s, c)
		s.Close()
		c.Close()
	}()
	_, _ = io.Copy(c, s)
	c.Close()
	s.Close()
}

// set mends (up) or cuts the link.
func (l *dbLink) set(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.up = up
	if !up {
		for _, c := range l.conns {
			c.Close()
		}
		l.conns = nil
	}
}

// TestSettlingGivesUpOnASilentPeer: a peer that does not answer (here
// one that refuses the connection) is asked, once the database is back,
// for the stated time and no longer: it writes back when it returns, and
// launches meanwhile do not wait broker.peer_timeout for it for ever.
func TestSettlingGivesUpOnASilentPeer(t *testing.T) {
	pg := testkit.StartPostgres(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	r := newRig(t, pg.NewDB(t), func(c *config.Config) {
		c.Broker.Peers = []string{"https://" + closed.Addr().String()}
	})
	const settleMax = 5 * time.Second
	broker.SetPeerSettleMax(r.b, settleMax)
	r.agent("h1", "desk", "")
	w := &world{name: "broker", r: r, host: map[string]string{}, id: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := pg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	w.launch(t, "u1")
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	maintain(t, ctx, r.b)
	backOnDatabase(t, w)
	back := time.Now()
	count := func() float64 { return peerQuestions(t, r, "unreachable") }
	before := count()
	w.launch(t, "u2")
	if got := count() - before; got != 1 || time.Since(back) > settleMax {
		t.Fatalf("launch back on the database, a peer silent: asked it %v times (%s after the return), want once", got, time.Since(back))
	}
	time.Sleep(time.Until(back.Add(settleMax + 500*time.Millisecond)))
	before = count()
	w.launch(t, "u3")
	w.launch(t, "u4")
	if got := count() - before; got != 1 {
		t.Errorf("two launches past %s after the return, a peer silent: asked it %v times, want once (then given up on)", settleMax, got)
	}
	if !strings.Contains(r.logs.String(), "no longer waiting for it to write back") {
		t.Errorf("the log does not say the silent peer was given up on:\n%s", r.logs.String())
	}
}

// backOnDatabase waits until w's broker places in the database again.
func backOnDatabase(t *testing.T, w *world) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(w.r.logs.String(), "database reachable again") {
		if time.Now().After(deadline) {
			t.Fatalf("%s never went back to the database:\n%s", w.name, w.r.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// peerQuestions reads how many peer questions r's broker counted with
// result.
func peerQuestions(t *testing.T, r *rig, result string) float64 {
	t.Helper()
	return testutil.ToFloat64(mustCounter(t, r.reg, "deskway_broker_peer_questions_total", "result", result))
}

// wantOneLiveU1 checks, after B's write-back, that every world sees u1
// active and the database holds one record of u1: id, verified.
func wantOneLiveU1(t *testing.T, ctx context.Context, id string, worlds ...*world) {
	t.Helper()
	for _, w := range worlds {
		if got := w.settled(t); got["u1"] != store.Active {
			t.Errorf("%s: live sessions after B's write-back: %v, want u1 active", w.name, got)
		}
	}
	all, err := worlds[0].r.store.Sessions(ctx, "u1", true, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].ID != id || all[0].Unverified {
		t.Errorf("u1's records after B's write-back: %+v, want only %s, verified", all, id)
	}
}
