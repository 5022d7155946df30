package broker

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
)

func TestPickFollowsTheDatabaseRules(t *testing.T) {
	now := time.Now()
	rnd := rand.New(rand.NewPCG(1, 2))
	h := func(name, zone string, sessions, pending int) store.Host {
		return store.Host{Name: name, Group: "g", Zone: zone, Weight: 1, SessionLimit: 10, LogonLimit: 2,
			Sessions: sessions, Pending: pending, LastSeen: now, DiskIdle: 1}
	}
	l := store.Launch{User: "u", Group: "g", Zone: "eu", Stale: now.Add(-time.Minute)}
	pick := func(hosts []store.Host, l store.Launch) string {
		got, ok := Pick(hosts, l, rnd)
		if !ok {
			return "none"
		}
		return got.Name
	}
	if got := pick([]store.Host{h("us", "us", 0, 0), h("eu", "eu", 5, 0)}, l); got != "eu" {
		t.Fatalf("zone preference: %s", got)
	}
	if got := pick([]store.Host{h("a", "", 5, 0), h("b", "", 1, 0)}, l); got != "b" {
		t.Fatalf("breadth-first: %s", got)
	}
	d := l
	d.Depth = true
	if got := pick([]store.Host{h("a", "", 5, 0), h("b", "", 1, 0)}, d); got != "a" {
		t.Fatalf("depth-first: %s", got)
	}
	full, busy, sick, gone, drained := h("full", "", 10, 0), h("busy", "", 0, 2), h("sick", "", 0, 0), h("gone", "", 0, 0), h("drained", "", 0, 0)
	sick.Unhealthy, gone.LastSeen, drained.AgentDrain = "disk idle 10% < 50%", now.Add(-time.Hour), true
	if got := pick([]store.Host{full, busy, sick, gone, drained}, l); got != "none" {
		t.Fatalf("no eligible host, got %s", got)
	}
	mine, theirs, free := h("mine", "", 0, 0), h("theirs", "", 0, 0), h("free", "", 0, 0)
	mine.AssignedUser, theirs.AssignedUser = "u", "v"
	p := l
	p.Personal = true
	if got := pick([]store.Host{theirs, free, mine}, p); got != "mine" {
		t.Fatalf("personal: %s", got)
	}
	if got := pick([]store.Host{theirs, free}, p); got != "free" {
		t.Fatalf("personal, first launch: %s", got)
	}
	w1, w2 := h("w1", "", 4, 0), h("w2", "", 6, 0)
	w2.Weight = 2 // 60 % of a double-size host weighs as 30 %
	if got := pick([]store.Host{w1, w2}, l); got != "w2" {
		t.Fatalf("weights: %s", got)
	}
}

func TestJournalSurvivesATornLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	c := newLocalCache(path, path+".cache", offline())
	c.loadSince(c.mark(), []store.Host{{Name: "h", Group: "g", Weight: 1, SessionLimit: 5, LogonLimit: 5, LastSeen: time.Now()}}, nil, true)
	p, err := c.place(store.Launch{User: "u", Group: "g", SessionID: "s1", Now: time.Now(), Stale: time.Now().Add(-time.Minute)})
	if err != nil || p.Host != "h" {
		t.Fatalf("place = %+v %v", p, err)
	}
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	_, _ = f.WriteString(`{"ID":"s2","User":"v","Gro`) // the crash came mid-write
	f.Close()
	claimed, err := c.claim()
	if err != nil {
		t.Fatal(err)
	}
	got, err := readJournal(claimed)
	if err != nil || len(got) != 1 || got[0].ID != "s1" || got[0].Host != "h" || got[0].State != store.Launching {
		t.Fatalf("journal = %+v %v", got, err)
	}
	// A second claim hands over the same unfinished journal.
	if again, _ := c.claim(); again != claimed {
		t.Fatalf("second claim = %q, want %q", again, claimed)
	}
}

// TestJournalTornThenAppended: a crash tears the last line; the broker
// restarts and answers another offline launch; both answered launches are
// replayed. Appended straight after the torn line, the new one joined it
// and was lost.
func TestJournalTornThenAppended(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	hosts := []store.Host{{Name: "h", Group: "g", Weight: 1, SessionLimit: 5, LogonLimit: 5, LastSeen: time.Now()}}
	launch := func(c *localCache, user, id string) {
		t.Helper()
		if p, err := c.place(store.Launch{User: user, Group: "g", SessionID: id, Now: time.Now(), Stale: time.Now().Add(-time.Minute)}); err != nil || p.Host != "h" {
			t.Fatalf("place %s = %+v %v", id, p, err)
		}
	}
	c := newLocalCache(path, path+".cache", offline())
	c.loadSince(c.mark(), hosts, nil, true)
	launch(c, "u", "s1")
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	_, _ = f.WriteString(`{"ID":"s2","User":"v","Gro`) // the crash came mid-write
	f.Close()
	restarted := newLocalCache(path, path+".cache", offline())
	restarted.loadSince(restarted.mark(), hosts, nil, true)
	launch(restarted, "w", "s3")
	claimed, err := restarted.claim()
	if err != nil {
		t.Fatal(err)
	}
	got, err := readJournal(claimed)
	if err != nil || len(got) != 2 || got[0].ID != "s1" || got[1].ID != "s3" {
		t.Fatalf("journal = %+v %v, want s1 and s3", got, err)
	}
}

// offline is a broker's offline flag, set: the cache journals.
func offline() *atomic.Bool {
	var b atomic.Bool
	b.Store(true)
	return &b
}

// TestOfflineReportsNeedTheHostsRegistration: while the database is away
// the cache checks a report's registration as the database would, so a
// removed host's credential cannot drain the host that joined under its
// name (or invent its sessions), even in the moment the outage begins.
func TestOfflineReportsNeedTheHostsRegistration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	c := newLocalCache(path, path+".cache", offline())
	c.loadSince(c.mark(), []store.Host{{Name: "h", Group: "g", Registration: "new", Weight: 1, SessionLimit: 5, LogonLimit: 5, DiskIdle: 1, LastSeen: time.Now()}}, nil, true)
	old := store.Report{Host: "h", Registration: "old", Drain: true, DiskIdle: 1, Now: time.Now(), Sessions: map[string]string{"mallory": store.Active}}
	if err := c.offlineHeartbeat(old); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a removed host's heartbeat: %v, want ErrNotFound", err)
	}
	if err := c.offlineEvent(store.Event{Host: "h", Registration: "old", Users: []string{"mallory"}, State: store.Active, Now: time.Now()}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a removed host's event: %v, want ErrNotFound", err)
	}
	if h := c.snapshot("g")[0]; h.AgentDrain {
		t.Fatal("the removed host's credential drained the new host")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the refused reports were journaled: %v", err)
	}
	old.Registration, old.Drain = "new", false
	if err := c.offlineHeartbeat(old); err != nil {
		t.Fatalf("the new host's own heartbeat: %v", err)
	}
}
