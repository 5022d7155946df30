package auth

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestThrottleMemoryIsBounded: a user key does not grow with the name
// typed, and windows that expired are dropped once a window has passed,
// not kept until a map is full.
func TestThrottleMemoryIsBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	th := NewThrottle(5, 20, time.Minute, func() time.Time { return now })
	for i := range 1000 {
		th.Fail(strings.Repeat("x", 3000)+fmt.Sprint(i), netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}))
	}
	for k := range th.pair {
		if len(k.user) > 71 {
			t.Fatalf("a 3,000-byte name is kept as a %d-byte key", len(k.user))
		}
	}
	now = now.Add(2 * time.Minute)
	th.Fail("carol", netip.MustParseAddr("192.0.2.7"))
	if len(th.pair) != 1 || len(th.unfamiliar) != 1 || len(th.addr) != 1 {
		t.Fatalf("after the window: %d pair, %d unfamiliar, %d address windows kept (want 1 each)", len(th.pair), len(th.unfamiliar), len(th.addr))
	}
	// Long names still lock out.
	for range 5 {
		th.Fail(strings.Repeat("y", 3000), netip.MustParseAddr("192.0.2.8"))
	}
	if th.Check(strings.Repeat("y", 3000), netip.MustParseAddr("192.0.2.8")) == nil {
		t.Fatal("a long name is not locked out after five failures")
	}
}
