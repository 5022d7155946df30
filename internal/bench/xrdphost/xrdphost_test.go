package xrdphost

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/loopback"
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

// TestStartXRDPListensOnTheBenchsPort: xrdp comes up on the port asked
// for, not the system's 3389, logs into the bench's folder, and is gone
// once its programs are stopped.
func TestStartXRDPListensOnTheBenchsPort(t *testing.T) {
	testkit.RequireRoot(t)
	testkit.Require(t, "xrdp", "xrdp-sesman")
	testkit.Lock(t, testkit.LockSesman)
	port, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	procs, err := StartXRDP(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 2 {
		t.Fatalf("%d programs started, want the session manager and xrdp", len(procs))
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("xrdp does not listen on %s: %v", addr, err)
	}
	c.Close()
	ini, err := os.ReadFile(filepath.Join(dir, "xrdp.ini"))
	if err != nil || !strings.Contains(string(ini), "port=tcp://"+addr) {
		t.Fatalf("xrdp.ini in the bench's folder does not name %s: %v", addr, err)
	}
	// xrdp logs the connection above into the bench's folder.
	var log []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if log, _ = os.ReadFile(filepath.Join(dir, "xrdp.log")); strings.Contains(string(log), "connection") {
			break
		}
	}
	if !strings.Contains(string(log), "connection") {
		t.Errorf("xrdp logged no connection into the bench's folder: %q", log)
	}
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop()
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("xrdp still listens on %s after it was stopped", addr)
	}
}
