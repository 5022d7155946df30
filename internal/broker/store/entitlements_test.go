package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
)

// TestEntitlements: what an administrator sets is kept per group,
// replaced by the next setting, listed, and cleared; a group the database
// does not know is refused.
func TestEntitlements(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		setup(t, s, store.Group{Name: "desk", Kind: "pooled", Spread: "breadth"}, store.Group{Name: "lab", Kind: "pooled", Spread: "breadth"})
		at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
		if err := s.SetEntitlement(ctx, store.Entitlement{Group: "desk", Users: []string{"ann"}, Groups: []string{"staff"}, SetBy: "admin token 1", SetAt: at}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetEntitlement(ctx, store.Entitlement{Group: "desk", Users: []string{"bob"}, SetBy: "admin token 1 for ops", SetAt: at.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetEntitlement(ctx, store.Entitlement{Group: "lab", Groups: []string{"students"}, SetBy: "admin token 2", SetAt: at}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetEntitlement(ctx, store.Entitlement{Group: "nope", Users: []string{"x"}, SetAt: at}); err == nil {
			t.Fatal("an entitlement of an unknown delivery group was kept")
		}
		es, err := s.Entitlements(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) != 2 || es[0].Group != "desk" || !slices.Equal(es[0].Users, []string{"bob"}) || len(es[0].Groups) != 0 ||
			es[0].SetBy != "admin token 1 for ops" || !es[0].SetAt.Equal(at.Add(time.Minute)) || es[1].Group != "lab" || !slices.Equal(es[1].Groups, []string{"students"}) {
			t.Fatalf("entitlements: %+v", es)
		}
		if ok, err := s.ClearEntitlement(ctx, "desk"); err != nil || !ok {
			t.Fatalf("clear: %v %v", ok, err)
		}
		if ok, err := s.ClearEntitlement(ctx, "desk"); err != nil || ok {
			t.Fatalf("second clear: %v %v", ok, err)
		}
		if es, err = s.Entitlements(ctx); err != nil || len(es) != 1 || es[0].Group != "lab" {
			t.Fatalf("after clear: %+v %v", es, err)
		}
	})
}
