package testkit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartStopsTheWholeGroup: a test's process is stopped when all it
// started has ended, not when the command alone has: here the shell
// dies at SIGTERM at once, and a child ignoring it writes a file 1.5 s
// later, which the cleanup waits for. (make run's shell ends at once,
// and deskway after its shutdown.)
func TestStartStopsTheWholeGroup(t *testing.T) {
	done := filepath.Join(t.TempDir(), "done")
	t.Run("start", func(t *testing.T) {
		// The child lets go of the output, as a daemon does, so waiting
		// for the command's output to end does not wait for it.
		p := Start(t, nil, "sh", "-c", `(trap "" TERM; echo started; exec >/dev/null 2>&1; sleep 1.5; touch `+done+`) & sleep 60`)
		for !strings.Contains(p.Log.String(), "started") {
			time.Sleep(10 * time.Millisecond)
		}
	})
	if _, err := os.Stat(done); err != nil {
		t.Fatalf("the test ended before what its process started: %v", err)
	}
}
