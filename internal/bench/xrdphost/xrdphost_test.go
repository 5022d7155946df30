package xrdphost

import (
	"net"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/testkit"
)

// TestCheckNamesWhatStopsTheBench: a missing tool and a session manager
// already on 3350 are each named, so the operator knows what to fix.
func TestCheckNamesWhatStopsTheBench(t *testing.T) {
	testkit.RequireRoot(t)
	if err := Check("demo", "the user u", "sh", "no-such-tool-dw"); err == nil || !strings.Contains(err.Error(), "demo: no-such-tool-dw is missing") {
		t.Fatalf("a missing tool: %v", err)
	}
	testkit.Lock(t, testkit.LockSesman)
	ln, err := net.Listen("tcp", "127.0.0.1:3350")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := Check("demo", "the user u", "sh"); err == nil || !strings.Contains(err.Error(), "a session manager already listens on 127.0.0.1:3350") {
		t.Fatalf("a session manager on 3350: %v", err)
	}
	ln.Close()
	if err := Check("demo", "the user u", "sh"); err != nil {
		t.Fatalf("nothing in the way: %v", err)
	}
}

// TestSecretIsFreshHexOfTheLengthAsked: a rig's passwords and tokens are
// as long as it asks, odd lengths too, and not the same twice.
func TestSecretIsFreshHexOfTheLengthAsked(t *testing.T) {
	for _, n := range []int{12, 13, 40} {
		a, b := Secret(n), Secret(n)
		if len(a) != n || strings.Trim(a, "0123456789abcdef") != "" {
			t.Fatalf("Secret(%d) = %q", n, a)
		}
		if a == b {
			t.Fatalf("Secret(%d) gave %q twice", n, a)
		}
	}
}
