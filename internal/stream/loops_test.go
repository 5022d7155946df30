package stream

import (
	"runtime"
	"testing"
)

// TestLoopsLeaveAProcessor: the server starts one event loop fewer than
// Go's processors (and one on a single processor), so the rest of the
// process never takes a processor a loop is waiting for.
func TestLoopsLeaveAProcessor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for procs, want := range map[int]int{1: 1, 2: 1, 3: 2, 8: 7} {
		runtime.GOMAXPROCS(procs)
		ls, err := startLoops()
		if err != nil {
			t.Fatal(err)
		}
		got := len(ls.all)
		ls.close()
		if got != want {
			t.Errorf("%d loops on %d processors, want %d", got, procs, want)
		}
	}
}
