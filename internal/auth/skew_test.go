package auth

import (
	"strings"
	"testing"
	"time"
)

// TestClockSkewIsNamed: a fresh token checked by a clock 10 minutes
// ahead of or behind its issuer's is refused with the gap and the cure
// in the reason; one 20 s off either way is within the allowance.
func TestClockSkewIsNamed(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	issuer, _ := NewTokens(key, nil)
	tok, err := issuer.Mint("alice", nil, "host", 3389, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off  time.Duration
		want string // "" for accepted
	}{
		{10 * time.Minute, "ago and was valid for 5m0s"},
		{-10 * time.Minute, "ahead of this clock"},
		{20 * time.Second, ""},
		{-20 * time.Second, ""},
	} {
		gw, _ := NewTokens(key, func() time.Time { return time.Now().Add(c.off) })
		_, err := gw.Verify(tok)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s off: refused within the allowance: %v", c.off, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "NTP")):
			t.Errorf("%s off: %v, want a refusal saying %q and NTP", c.off, err, c.want)
		}
	}
}
