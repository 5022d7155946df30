package store_test

import (
	"context"
	"maps"
	"testing"

	"github.com/deskway/deskway/internal/broker/store"
)

// TestWriteBackOverLatePlacements: a placement a broker sent into a cut
// link and gave up on reaches the database when the link returns and
// stores a session nobody was told of. The write-back must leave what
// the users were told: the launch the broker placed from its cache under
// the same id moves to the host the journal names, and a late placement
// the journal voids (its launch was answered with the user's known
// session) is deleted before that session is written back, which would
// otherwise be stored as ended, the user's second live session; and a
// placement finished for a client that had gone, still launching, gives
// way to the journal's session its host reports the user logged on to.
// The hosts' counts follow, and a second write-back changes nothing.
func TestWriteBackOverLatePlacements(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		f := setup(t, s)
		f.host("h1", "desk", "", 10, 10)
		f.host("h2", "desk", "", 10, 10)
		// u1: the late statement placed x1 on one host; the cache placed
		// it, told u1, on the other.
		late := f.mustLaunch("u1", func(l *store.Launch) { l.SessionID = "x1" })
		told := map[string]string{"h1": "h2", "h2": "h1"}[late.Host]
		// u2: the late statement placed x2; the cache answered with u2's
		// session y2, placed from it earlier in the outage.
		f.mustLaunch("u2", func(l *store.Launch) { l.SessionID = "x2" })
		// u3: a broker finished z3 from its cache after u3's client had
		// given up; u3 got y3 from another broker and logged on to it,
		// and its host's report came back before y3's write-back.
		unused := f.mustLaunch("u3", func(l *store.Launch) { l.SessionID = "z3" })
		used := map[string]string{"h1": "h2", "h2": "h1"}[unused.Host]
		f.beat(used, store.Report{DiskIdle: 1, Sessions: map[string]string{"u3": store.Active}})
		journal := []store.Session{
			{ID: "y2", User: "u2", Group: "desk", Host: "h1", State: store.Launching, CreatedAt: t0, UpdatedAt: t0},
			{ID: "x1", User: "u1", Group: "desk", Host: told, State: store.Launching, CreatedAt: t0, UpdatedAt: t0},
			{ID: "y3", User: "u3", Group: "desk", Host: used, State: store.Launching, CreatedAt: t0, UpdatedAt: t0},
		}
		for round := range 2 {
			if _, err := s.Void(ctx, []string{"x2"}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Restore(ctx, journal, nil); err != nil {
				t.Fatal(err)
			}
			live, err := s.Sessions(ctx, "", false, 100)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, ss := range live {
				got[ss.ID] = ss.Host + " " + ss.State
			}
			want := map[string]string{"x1": told + " launching", "y2": "h1 launching", "y3": used + " active"}
			if !maps.Equal(got, want) {
				t.Fatalf("write-back %d: live sessions %v, want %v", round+1, got, want)
			}
			hs := f.hosts()
			if n, p := hs["h1"].Sessions+hs["h2"].Sessions, hs["h1"].Pending+hs["h2"].Pending; n != 3 || p != 2 {
				t.Fatalf("write-back %d: the hosts count %d sessions, %d launching; want 3 and 2", round+1, n, p)
			}
		}
	})
}
