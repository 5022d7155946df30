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
