package gateway_test

import (
	"strings"
	"testing"
	"time"
)

// waitLogged waits until the gateways hs have logged what at least n
// times in all, or fails after d. A tunnel's closing line, with its
// reason, comes after the tunnel leaves the admin API's list, so a test
// that saw the list empty waits for the line.
func waitLogged(t *testing.T, what string, n int, d time.Duration, hs ...*harness) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := 0
		for _, h := range hs {
			got += strings.Count(h.logs.String(), what)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q logged %d times in %s, want %d", what, got, d, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
