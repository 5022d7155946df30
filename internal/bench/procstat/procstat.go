// Package procstat reads a process's CPU time and resident memory from
// /proc, the counters the bench reports for the gateway and its peers.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"
)

// clockTick is USER_HZ, 100 on every Linux the bench runs on.
const clockTick = 100

// Sample is one reading of a process.
type Sample struct {
	At  time.Time
	CPU time.Duration // user + system since start
	RSS int64         // bytes
}

// Read samples pid (0 means this process).
func Read(pid int) (Sample, error) {
	s := Sample{At: time.Now()}
	p, err := proc(pid)
	if err != nil {
		return s, fmt.Errorf("procstat: %w", err)
	}
	st, err := p.Stat()
	if err != nil {
		return s, fmt.Errorf("procstat: %w", err)
	}
	s.CPU = ticks(int(st.UTime + st.STime))
	status, err := p.NewStatus()
	if err != nil {
		return s, fmt.Errorf("procstat: %w", err)
	}
	s.RSS = int64(status.VmRSS)
	return s, nil
}

func proc(pid int) (procfs.Proc, error) {
	if pid > 0 {
		return procfs.NewProc(pid)
	}
	return procfs.Self()
}

func ticks(n int) time.Duration { return time.Duration(n) * time.Second / clockTick }

// ReadTree samples pid and every live descendant, for servers that fork
// per connection: CPU includes children already reaped, RSS sums the
// live processes.
func ReadTree(pid int) (Sample, error) {
	root, err := Read(pid)
	if err != nil {
		return root, err
	}
	procs, _ := procfs.AllProcs()
	parent := map[int]int{}
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil {
			continue // ended meanwhile
		}
		parent[p.PID] = st.PPID
		if p.PID == pid {
			// Children it has waited for.
			root.CPU += ticks(st.CUTime + st.CSTime)
		}
	}
	for p := range parent {
		for a := parent[p]; a > 0; a = parent[a] {
			if a == pid {
				if s, err := Read(p); err == nil {
					root.CPU += s.CPU
					root.RSS += s.RSS
				}
				break
			}
		}
	}
	return root, nil
}

// CPUPercent is the CPU used between a and b as a percentage of one core.
func CPUPercent(a, b Sample) float64 {
	wall := b.At.Sub(a.At)
	if wall <= 0 {
		return 0
	}
	return 100 * float64(b.CPU-a.CPU) / float64(wall)
}

// ThreadsCPU is the time pid's live threads have run, in nanoseconds from
// the scheduler (/proc/PID/task/*/schedstat), where Read counts 10 ms
// ticks: for a process that uses a few percent of a core, ticks are too
// coarse to compare.
func ThreadsCPU(pid int) (time.Duration, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	var total time.Duration
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("procstat: %s/%s/schedstat: %w", dir, e.Name(), err)
		}
		total += time.Duration(ns)
	}
	return total, nil
}

// Self is this process's CPU time so far (user + system); 0 if /proc
// cannot be read, which a bench reports as no CPU measured.
func Self() time.Duration {
	s, _ := Read(0)
	return s.CPU
}
