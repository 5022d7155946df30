package procstat

import (
	"runtime"
	"testing"
	"time"
)

func TestReadSelf(t *testing.T) {
	a, err := Read(0)
	if err != nil {
		t.Fatal(err)
	}
	// Burn some CPU so the counter moves.
	end := time.Now().Add(200 * time.Millisecond)
	x := 0
	for time.Now().Before(end) {
		x++
	}
	b, _ := Read(0)
	if b.RSS <= 0 || b.CPU <= a.CPU {
		t.Fatalf("rss %d, cpu %s -> %s", b.RSS, a.CPU, b.CPU)
	}
	// How much of a core the loop got depends on the machine's load;
	// what cannot happen is none, or more than every core at once.
	if p := CPUPercent(a, b); p <= 0 || p > 100*float64(runtime.NumCPU())+10 {
		t.Fatalf("busy loop measured at %.0f%% of a core on %d cores", p, runtime.NumCPU())
	}
}
