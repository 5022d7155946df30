package procstat

import (
	"os"
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

// TestThreadsCPUCountsWork: spinning shows up as scheduler time. It
// waits on the condition, not on a wall-clock bound: on a loaded machine
// the spin simply takes longer.
func TestThreadsCPUCountsWork(t *testing.T) {
	a, err := ThreadsCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		for x := 0; x < 1e6; x++ {
		}
		b, err := ThreadsCPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if b-a >= 50*time.Millisecond {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute of spinning, schedstat grew %s", b-a)
		}
	}
}
