package gateway_test

import (
	"strings"
	"testing"
	"time"
)

// waitLogged waits until h has logged what at least n times, or fails
// after d. A tunnel's closing line, with its reason, comes after the
// tunnel leaves the admin API's list, so a test that saw the list empty
// waits for the line.
func waitLogged(t *testing.T, h *harness, what string, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := strings.Count(h.logs.String(), what)
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q logged %d times in %s, want %d", what, got, d, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
