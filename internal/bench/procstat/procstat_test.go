package procstat

import (
	"os"
	"os/exec"
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

// TestReadTreeCountsChildren checks that a tree's sample holds a live
// child's memory and the CPU of a child already waited for, as a server
// forking per connection needs.
func TestReadTreeCountsChildren(t *testing.T) {
	burn := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	if err := burn.Run(); err != nil {
		t.Fatal(err)
	}
	reaped := burn.ProcessState.UserTime() + burn.ProcessState.SystemTime()
	live := exec.Command("sleep", "30")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = live.Process.Kill(); _ = live.Wait() }()
	child, err := Read(live.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	self, err := Read(0)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := ReadTree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if tree.RSS < self.RSS+child.RSS/2 {
		t.Errorf("tree RSS %d, want at least this process's %d and most of the child's %d", tree.RSS, self.RSS, child.RSS)
	}
	// Ticks are 10 ms: allow two of rounding.
	if got := tree.CPU - self.CPU; got < reaped-20*time.Millisecond {
		t.Errorf("tree CPU beyond this process's = %v, want the waited-for child's %v", got, reaped)
	}
}
