package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
)

// TestLastUsed: per delivery group, the newest change to the user's
// sessions there (a launch, then a reconnection reported by the host),
// ended sessions included, and nobody else's.
func TestLastUsed(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		f := setup(t, open(), store.Group{Name: "desk", Kind: "pooled", Spread: "breadth"},
			store.Group{Name: "lab", Kind: "pooled", Spread: "breadth"}, store.Group{Name: "cad", Kind: "pooled", Spread: "breadth"})
		f.host("h1", "desk", "", 10, 10)
		f.host("h2", "lab", "", 10, 10)
		if used, err := f.s.LastUsed(ctx, "ann"); err != nil || len(used) != 0 {
			t.Fatalf("before any launch: %v, %v", used, err)
		}
		f.mustLaunch("ann")
		f.mustLaunch("ann", func(l *store.Launch) { l.Group, l.Now = "lab", t0.Add(time.Minute) })
		f.mustLaunch("bob", func(l *store.Launch) { l.Now = t0.Add(time.Hour) })
		used, err := f.s.LastUsed(ctx, "ann")
		if err != nil || len(used) != 2 || !used["desk"].Equal(t0) || !used["lab"].Equal(t0.Add(time.Minute)) {
			t.Fatalf("after ann's launches: %v, %v", used, err)
		}
		// The desk session logs on, then ends: the end is its last use.
		for i, state := range []string{"active", "ended"} {
			if _, err := f.s.Event(ctx, store.Event{Host: "h1", Users: []string{"ann"}, State: state, Now: t0.Add(time.Duration(2+i) * time.Minute)}); err != nil {
				t.Fatal(err)
			}
		}
		used, err = f.s.LastUsed(ctx, "ann")
		if err != nil || !used["desk"].Equal(t0.Add(3*time.Minute)) || !used["lab"].Equal(t0.Add(time.Minute)) {
			t.Fatalf("after ann's desk session ended: %v, %v", used, err)
		}
	})
}
