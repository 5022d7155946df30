package broker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// world is one broker under test as its agents see it: where each user's
// session is, for the events and heartbeats its hosts send.
type world struct {
	name    string
	r       *rig
	creds   map[string]string
	host    map[string]string // user -> host of their live session
	id      map[string]string // user -> session id
	journal string
	// slow makes the world's clients act as deskway's do when the
	// broker answers 503 (its database too slow to answer in time): a
	// launch is tried again, and an agent's event or heartbeat is
	// dropped, the host's next heartbeat saying where its sessions are.
	slow bool
}

func newWorld(t *testing.T, name, dsn string, hosts []string) *world {
	return newWorldOn(t, name, dsn, hosts, rigNet{}, nil)
}

// newWorldOn is newWorld with the broker listening on rn's listener and
// asking peers in an outage.
func newWorldOn(t *testing.T, name, dsn string, hosts []string, rn rigNet, peers []string) *world {
	w := &world{name: name, creds: map[string]string{}, host: map[string]string{}, id: map[string]string{}}
	w.r = newRigOn(t, dsn, rn, func(c *config.Config) {
		c.Broker.DeliveryGroups[0].LogonLimit = 100
		c.Broker.Peers = peers
		w.journal = filepath.Join(c.StateDir, "broker-offline.journal")
	})
	for _, h := range hosts {
		w.creds[h] = w.r.agent(h, "desk", "")
	}
	return w
}

func (w *world) launch(t *testing.T, user string) *brokerapi.LaunchResponse {
	t.Helper()
	res, err := w.r.launch(brokerclient.Bearer("frontend-token"), brokerapi.LaunchRequest{DeliveryGroup: "desk", User: user, Groups: []string{"bench"}})
	for try := 1; w.slow && status(err) == http.StatusServiceUnavailable && try < 10; try++ {
		t.Logf("%s: launch for %s answered %v; again", w.name, user, err)
		time.Sleep(500 * time.Millisecond)
		res, err = w.r.launch(brokerclient.Bearer("frontend-token"), brokerapi.LaunchRequest{DeliveryGroup: "desk", User: user, Groups: []string{"bench"}})
	}
	if err != nil {
		t.Fatalf("%s: launch for %s: %v", w.name, user, err)
	}
	w.host[user], w.id[user] = res.Host, res.SessionID
	return res
}

func (w *world) event(t *testing.T, user, state string) {
	t.Helper()
	h := w.host[user]
	err := w.r.client.Events(context.Background(), w.creds[h], brokerapi.Events{Host: h, Events: []brokerapi.Event{{User: user, State: state}}})
	if w.slow && status(err) == http.StatusServiceUnavailable {
		t.Logf("%s: event %s %s on %s dropped: %v", w.name, user, state, h, err)
	} else if err != nil {
		t.Fatalf("%s: event %s %s on %s: %v", w.name, user, state, h, err)
	}
	if state == store.Ended {
		delete(w.host, user)
		delete(w.id, user)
	}
}

// beat sends host h's heartbeat: the sessions the model has on it that
// have logged on.
func (w *world) beat(t *testing.T, h string, states map[string]string) {
	t.Helper()
	hb := brokerapi.Heartbeat{Host: h, DiskIdle: 0.9, Sessions: []brokerapi.Session{}}
	for u, host := range w.host {
		if host == h && states[u] != store.Launching {
			hb.Sessions = append(hb.Sessions, brokerapi.Session{User: u, State: states[u]})
		}
	}
	_, err := w.r.client.Heartbeat(context.Background(), w.creds[h], hb)
	if w.slow && status(err) == http.StatusServiceUnavailable {
		t.Logf("%s: heartbeat of %s dropped: %v", w.name, h, err)
	} else if err != nil {
		t.Fatalf("%s: heartbeat of %s: %v", w.name, h, err)
	}
}

// settled waits until the broker is back on its database with nothing
// left to write back, then returns the live sessions (user -> state) and
// checks the hosts' counters against them.
func (w *world) settled(t *testing.T) map[string]string {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, jerr := os.Stat(w.journal)
		_, rerr := os.Stat(w.journal + ".restoring")
		if os.IsNotExist(jerr) && os.IsNotExist(rerr) && w.r.store.Ping(ctx) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the journal was never written back:\n%s", w.name, w.r.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	live, err := w.r.store.Sessions(ctx, "", false, 1000)
	if err != nil {
		t.Fatal(err)
	}
	got, onHost := map[string]string{}, map[string]int{}
	for _, s := range live {
		if _, dup := got[s.User]; dup {
			t.Fatalf("%s: %s has two live sessions: %+v", w.name, s.User, live)
		}
		got[s.User] = s.State
		onHost[s.Host]++
		if w.id[s.User] != s.ID || w.host[s.User] != s.Host {
			t.Errorf("%s: %s's live session is %s on %s; its launch answered %s on %s", w.name, s.User, s.ID, s.Host, w.id[s.User], w.host[s.User])
		}
	}
	hosts, err := w.r.store.Hosts(ctx, "desk")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		if h.Sessions != onHost[h.Name] {
			t.Errorf("%s: %s counts %d sessions, holds %d", w.name, h.Name, h.Sessions, onHost[h.Name])
		}
	}
	return got
}

// TestOutageEventsAreWrittenBackInOrder is the outage an admin reported:
// two hosts that hold one session each; u1 on one; the database stops;
// u1 logs off, u9 logs on and off, u1 launches again. When the database
// returns it holds exactly that: u1's first session ended, u9's ended,
// u1's second launching, each host counting what it holds.
func TestOutageEventsAreWrittenBackInOrder(t *testing.T) {
	pg := testkit.StartPostgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWorld(t, "broker", pg.NewDB(t), nil)
	maintain(t, ctx, w.r.b)
	for _, h := range []string{"hostX", "hostY"} {
		join, _ := w.r.tokens.MintJoin("desk", "", time.Hour, 0)
		res, err := w.r.register(join, brokerapi.RegisterRequest{Name: h, Address: h + ".lan", SessionLimit: 1})
		if err != nil {
			t.Fatal(err)
		}
		w.creds[h] = res.Credential
		w.r.beat(h, res.Credential, brokerapi.Heartbeat{DiskIdle: 0.9})
	}
	first := w.launch(t, "u1")
	w.event(t, "u1", store.Active)
	firstHost, firstID := first.Host, first.SessionID
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.event(t, "u1", store.Ended)
	w.launch(t, "u9")
	w.event(t, "u9", store.Active)
	w.event(t, "u9", store.Ended)
	again := w.launch(t, "u1")
	if again.Reconnect {
		t.Fatalf("u1 reconnected to a session that ended: %+v", again)
	}
	// The admin API during the outage: a drain is taken (and said to be
	// the cache's), a removal needs the database and says so.
	admin := func(method, path, body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		w.r.admin.ServeHTTP(rec, req)
		return rec
	}
	if rec := admin("POST", "/api/v1/broker/hosts/"+firstHost+"/drain", `{"drain":true}`); rec.Code != http.StatusOK || rec.Header().Get("Deskway-Source") != "local-host-cache" {
		t.Fatalf("drain during the outage: %d %s %v", rec.Code, rec.Body, rec.Header())
	}
	if rec := admin("DELETE", "/api/v1/broker/hosts/"+firstHost, ""); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "needs the database") {
		t.Fatalf("removal during the outage: %d %s", rec.Code, rec.Body)
	}
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	live := w.settled(t)
	if len(live) != 1 || live["u1"] != store.Launching {
		t.Fatalf("live sessions after the write-back: %v, want u1 launching only", live)
	}
	all, err := w.r.store.Sessions(context.Background(), "", true, 100)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, s := range all {
		rows = append(rows, fmt.Sprintf("%s|%s|%s", s.User, s.Host, s.State))
	}
	sort.Strings(rows)
	want := []string{"u1|" + again.Host + "|launching", "u1|" + firstHost + "|ended", "u9|" + w.hostOfEnded(all, "u9") + "|ended"}
	sort.Strings(want)
	if strings.Join(rows, " ") != strings.Join(want, " ") {
		t.Fatalf("sessions after the write-back:\n%v\nwant\n%v", rows, want)
	}
	for _, s := range all {
		if s.User == "u1" && s.State == store.Ended && s.ID != firstID {
			t.Fatalf("u1's ended session is %s, its first launch answered %s", s.ID, firstID)
		}
	}
	hs, err := w.r.store.Hosts(context.Background(), "desk")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.AdminDrain != (h.Name == firstHost) {
			t.Fatalf("after the write-back %s has admin_drain %v; the outage drained %s", h.Name, h.AdminDrain, firstHost)
		}
	}
	if res := w.launch(t, "u1"); !res.Reconnect || res.SessionID != again.SessionID {
		t.Fatalf("u1's launch after the outage: %+v, want a reconnect to %s", res, again.SessionID)
	}
}

func (w *world) hostOfEnded(all []store.Session, user string) string {
	for _, s := range all {
		if s.User == user {
			return s.Host
		}
	}
	return ""
}

// TestOutageModel drives random launches, logons, disconnects,
// reconnects, logoffs and heartbeats against two brokers: one whose
// PostgreSQL fails at random points, and one on SQLite that never loses
// its database. The database is killed and restarted, or stalls (every
// statement sent meanwhile answered late, past the broker's 3 s):
// statements the broker gave up on still take effect when it resumes. Once the outages are written back both databases hold the
// same sessions, in the same states, as the model.
func TestOutageModel(t *testing.T) {
	pg := testkit.StartPostgres(t)
	hosts := []string{"h1", "h2", "h3"}
	// A stall of 4 s ends before the broker's ping after its 3 s wait
	// times out, so the broker answers 503 and stays on the database; one
	// of 8 s sends it to the local host cache, and the statements it gave
	// up on run when the database resumes, after its own placements.
	for _, c := range []struct {
		seed  uint64
		fault string
		stall time.Duration
	}{{1, "kill", 0}, {2, "kill", 0}, {3, "stall", 4 * time.Second}, {4, "stall", 8 * time.Second}} {
		t.Run(fmt.Sprint(c.fault, " seed ", c.seed), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			steady := newWorld(t, "steady", "", hosts)
			outage := newWorld(t, "outage", pg.NewDB(t), hosts)
			outage.slow = c.fault == "stall"
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("outage broker's log:\n%s", outage.r.logs.String())
				}
			})
			maintain(t, ctx, outage.r.b)
			rng := rand.New(rand.NewPCG(c.seed, 7))
			states := map[string]string{} // user -> state of their live session
			down := false
			var stalls sync.WaitGroup
			defer stalls.Wait()
			for step := range 120 {
				switch {
				case c.fault == "stall" && step%30 == 10:
					stalls.Go(func() {
						if err := pg.Stall(ctx, c.stall); err != nil {
							t.Error(err)
						}
					})
					t.Logf("step %d: database stalls for %s", step, c.stall)
				case c.fault == "kill" && (step%30 == 10 && !down || step%30 == 25 && down):
					if down {
						if err := pg.Restart(context.Background()); err != nil {
							t.Fatal(err)
						}
					} else if err := pg.Kill(context.Background()); err != nil {
						t.Fatal(err)
					}
					down = !down
					t.Logf("step %d: database down %v", step, down)
				}
				u := fmt.Sprint("u", rng.IntN(8))
				st, has := states[u]
				switch op := rng.IntN(6); {
				case op == 0 || !has:
					a, b := steady.launch(t, u), outage.launch(t, u)
					// A launch answered 503 may still have placed the
					// session, late: tried again, it reconnects to it.
					late := !has && outage.slow && b.Reconnect
					if a.Reconnect != has || b.Reconnect != has && !late {
						t.Fatalf("step %d: %s launched with a session %v: reconnect %v (steady) and %v (outage)", step, u, has, a.Reconnect, b.Reconnect)
					}
					if !has {
						states[u] = store.Launching
					}
					t.Logf("step %d: %s launches on %s (outage broker)", step, u, outage.host[u])
				case op == 1 && st == store.Active:
					steady.event(t, u, store.Disconnected)
					outage.event(t, u, store.Disconnected)
					states[u] = store.Disconnected
					t.Logf("step %d: %s disconnects", step, u)
				case op == 2 && st != store.Active:
					steady.event(t, u, store.Active)
					outage.event(t, u, store.Active)
					states[u] = store.Active
					t.Logf("step %d: %s active", step, u)
				case op == 3:
					steady.event(t, u, store.Ended)
					outage.event(t, u, store.Ended)
					delete(states, u)
					t.Logf("step %d: %s logs off", step, u)
				default:
					h := hosts[rng.IntN(len(hosts))]
					steady.beat(t, h, states)
					outage.beat(t, h, states)
					t.Logf("step %d: heartbeat of %s", step, h)
				}
			}
			if down {
				if err := pg.Restart(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			stalls.Wait()
			if outage.slow {
				// The agents' next heartbeats: what a dropped report
				// left behind is put right.
				for _, h := range hosts {
					outage.beat(t, h, states)
				}
			}
			a, b := steady.settled(t), outage.settled(t)
			if fmt.Sprint(a) != fmt.Sprint(states) || fmt.Sprint(b) != fmt.Sprint(states) {
				t.Fatalf("live sessions:\nmodel   %v\nsteady  %v\noutage  %v", states, a, b)
			}
		})
	}
}

// TestTwoBrokersInOneOutage: two brokers share PostgreSQL and both lose
// it. Each places from its own copy, knowing nothing of the other's
// launches, so both fill a host of two slots and both give one user a
// session. The write-back resolves it by the documented rule: a user's
// first session written back stays live and a later one from the other
// broker is stored as ended, so the user's next launch, through either
// broker, reconnects to the one that stayed; the host counts what it
// really holds, one over its limit until a session ends.
func TestTwoBrokersInOneOutage(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newWorld(t, "broker A", dsn, nil)
	join, _ := a.r.tokens.MintJoin("desk", "", time.Hour, 0)
	res, err := a.r.register(join, brokerapi.RegisterRequest{Name: "h1", Address: "h1.lan", SessionLimit: 2})
	if err != nil {
		t.Fatal(err)
	}
	a.creds["h1"] = res.Credential
	a.r.beat("h1", res.Credential, brokerapi.Heartbeat{DiskIdle: 0.9})
	b := newWorld(t, "broker B", dsn, nil) // starts with h1 in its copy
	b.creds["h1"] = res.Credential
	maintain(t, ctx, a.r.b)
	maintain(t, ctx, b.r.b)
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	first := a.launch(t, "u1")
	a.launch(t, "u3") // h1 is full in A's copy
	b.launch(t, "u2") // and in B's, with other sessions
	second := b.launch(t, "u1")
	if first.Host != "h1" || second.Host != "h1" || second.Reconnect {
		t.Fatalf("offline launches: %+v and %+v", first, second)
	}
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*world{a, b} {
		deadline := time.Now().Add(60 * time.Second)
		for {
			_, jerr := os.Stat(w.journal)
			_, rerr := os.Stat(w.journal + ".restoring")
			if os.IsNotExist(jerr) && os.IsNotExist(rerr) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never wrote its journal back:\n%s", w.name, w.r.logs.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	live, err := a.r.store.Sessions(context.Background(), "", false, 100)
	if err != nil {
		t.Fatal(err)
	}
	byUser := map[string][]string{}
	for _, s := range live {
		byUser[s.User] = append(byUser[s.User], s.ID)
	}
	if len(byUser["u1"]) != 1 || len(byUser["u2"]) != 1 || len(byUser["u3"]) != 1 {
		t.Fatalf("live sessions after both write-backs: %+v", live)
	}
	kept := byUser["u1"][0]
	if kept != first.SessionID && kept != second.SessionID {
		t.Fatalf("u1's live session %s is neither of its launches", kept)
	}
	all, _ := a.r.store.Sessions(context.Background(), "u1", true, 10)
	if len(all) != 2 {
		t.Fatalf("u1's sessions: %+v, want the live one and the other ended", all)
	}
	hosts, err := a.r.store.Hosts(context.Background(), "desk")
	if err != nil || len(hosts) != 1 || hosts[0].Sessions != 3 {
		t.Fatalf("h1 after the write-back: %+v %v, want it counting the 3 sessions it holds (its limit is 2)", hosts, err)
	}
	for _, w := range []*world{a, b} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			r, err := w.r.launch(brokerclient.Bearer("frontend-token"), brokerapi.LaunchRequest{DeliveryGroup: "desk", User: "u1", Groups: []string{"bench"}})
			if err == nil && r.Reconnect && r.SessionID == kept {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("u1's launch through %s: %+v %v, want a reconnect to %s", w.name, r, err, kept)
			}
			time.Sleep(500 * time.Millisecond) // the broker's copy catches up with the database
		}
	}
}
