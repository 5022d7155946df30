// Package procstat reads a process's CPU time and resident memory from
// /proc, the counters the bench reports for the gateway and its peers.
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
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
	p := "self"
	if pid > 0 {
		p = strconv.Itoa(pid)
	}
	s := Sample{At: time.Now()}
	stat, err := os.ReadFile("/proc/" + p + "/stat")
	if err != nil {
		return s, fmt.Errorf("procstat: %w", err)
	}
	// Fields after the command name (which may hold spaces) start after ')'.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return s, fmt.Errorf("procstat: malformed /proc/%s/stat", p)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 22 {
		return s, fmt.Errorf("procstat: short /proc/%s/stat", p)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	s.CPU = time.Duration(ut+st) * time.Second / clockTick
	status, err := os.ReadFile("/proc/" + p + "/status")
	if err != nil {
		return s, fmt.Errorf("procstat: %w", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			s.RSS = kb << 10
		}
	}
	return s, nil
}

// ReadTree samples pid and every live descendant, for servers that fork
// per connection: CPU includes children already reaped, RSS sums the
// live processes.
func ReadTree(pid int) (Sample, error) {
	root, err := Read(pid)
	if err != nil {
		return root, err
	}
	root.CPU += reapedCPU(pid)
	ents, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp := ppid(p); pp > 0 {
			parent[p] = pp
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

func statFields(pid int) []string {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(stat[i+1:]))
}

func ppid(pid int) int {
	f := statFields(pid)
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}

// reapedCPU is the user and system time of pid's children it has waited for.
func reapedCPU(pid int) time.Duration {
	f := statFields(pid)
	if len(f) < 15 {
		return 0
	}
	cu, _ := strconv.ParseInt(f[13], 10, 64)
	cs, _ := strconv.ParseInt(f[14], 10, 64)
	return time.Duration(cu+cs) * time.Second / clockTick
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
