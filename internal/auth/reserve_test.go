package auth

import (
	"net/netip"
	"testing"
	"time"
)

// TestReserveCountsAtOnce: reservations count before their verdict, so
// the sixth of six outstanding attempts is refused; a released one and a
// success no longer count; ReserveUser leaves the address's count alone.
func TestReserveCountsAtOnce(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	th := NewThrottle(5, 20, time.Minute, func() time.Time { return now })
	from := netip.MustParseAddr("192.0.2.7")
	var held []*Attempt
	for i := range 5 {
		a, lk := th.Reserve("carol", from)
		if lk != nil {
			t.Fatalf("reservation %d refused: %v", i+1, lk)
		}
		held = append(held, a)
	}
	if _, lk := th.Reserve("carol", from); lk == nil {
		t.Fatal("a sixth attempt while five are outstanding was let through")
	}
	held[0].Release()
	a, lk := th.Reserve("carol", from)
	if lk != nil {
		t.Fatalf("after a release: %v", lk)
	}
	a.Succeed("carol")
	if _, lk := th.Reserve("carol", from); lk != nil {
		t.Fatalf("after a success from this address: %v", lk)
	}
	for range 30 {
		if u, lk := th.ReserveUser("entry-"+now.String(), from); lk == nil {
			u.Release()
		}
	}
	th.mu.Lock()
	n := th.addr[Source(from)].count
	th.mu.Unlock()
	if n != 5 { // four held, one from the last Reserve above
		t.Fatalf("the address counts %d failures, want 5", n)
	}
}
