package ttff

import (
	"os"
	"testing"
	"time"
)

// TestTraceCountsSleepsBeforeTheFirstFrame reads a legacy-transport
// connection's strace: the start, the two connections to the gateway,
// the 10 ms and 100 ms sleeps before the first frame (one of them on
// another thread, split into unfinished and resumed lines), and not the
// sleep after it.
func TestTraceCountsSleepsBeforeTheFirstFrame(t *testing.T) {
	f, err := os.Open("testdata/legacy.strace")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := parseTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(1795816507, 822469000); !tr.execve.Equal(want) {
		t.Fatalf("execve at %v, want %v", tr.execve, want)
	}
	frame := time.Unix(1795816508, 900000000)
	w := tr.sleeps(100*time.Millisecond, frame)
	if w.count != 3 || w.threads != 2 || w.mainThread < 200*time.Millisecond || w.mainThread > 201*time.Millisecond {
		t.Errorf("100 ms sleeps: %+v, want 3 on 2 threads, 200 ms on the busiest", w)
	}
	if w := tr.sleeps(10*time.Millisecond, frame); w.count != 1 {
		t.Errorf("10 ms sleeps: %+v, want 1", w)
	}
	if n := tr.connects(25696, frame); n != 2 {
		t.Errorf("connects to the gateway: %d, want 2", n)
	}
	if n := tr.connects(3389, frame); n != 0 {
		t.Errorf("connects to another port: %d, want 0", n)
	}
}
