package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Counters is one reading of the host's cumulative counters.
type Counters struct {
	At        time.Time
	CPUBusy   uint64 // jiffies not idle or waiting on I/O
	CPUTotal  uint64
	MemTotal  uint64 // bytes
	MemAvail  uint64
	MemSome10 float64 // PSI memory "some" avg10, percent
	// CPUSome10 is PSI cpu "some" avg10, percent: the share of the last
	// 10 s in which a runnable task waited for a CPU.
	CPUSome10 float64
	Disks     map[string]DiskCounters
	HasPSI    bool
	// From /proc/vmstat, cumulative since boot: major page faults (a page
	// read from disk, which a session feels as a stall) and pages swapped
	// in and out. Memory use alone cannot tell a full host from one that
	// thrashes; these can.
	MajorFaults uint64
	SwapIn      uint64
	SwapOut     uint64
}

// DiskCounters are one block device's fields from /proc/diskstats.
type DiskCounters struct {
	IOs    uint64 // reads and writes completed
	IOms   uint64 // time spent on reads and writes, summed over requests
	BusyMS uint64 // time the device had I/O in flight
}

// Load is what an agent reports, derived from two readings.
type Load struct {
	CPU, Memory    float64 // busy fractions
	DiskIdle       float64 // idle fraction of the busiest disk
	DiskLatencyMS  float64 // average ms per request of the slowest disk
	MemoryPressure float64 // fraction of time some task stalled on memory
	// CPUPressure is the fraction of time some runnable task waited for a
	// CPU, over the whole machine (/proc/pressure/cpu is the root cgroup's).
	CPUPressure float64
	// Page activity over the interval, pages per second.
	MajorFaultsPerSec, SwapInPerSec, SwapOutPerSec float64
}

// ReadCounters reads /proc under root (normally "/proc").
func ReadCounters(root string) (Counters, error) {
	c := Counters{At: time.Now(), Disks: map[string]DiskCounters{}}
	stat, err := os.ReadFile(filepath.Join(root, "stat"))
	if err != nil {
		return c, fmt.Errorf("agent: %w", err)
	}
	if c.CPUBusy, c.CPUTotal, err = parseStat(stat); err != nil {
		return c, err
	}
	mem, err := os.ReadFile(filepath.Join(root, "meminfo"))
	if err != nil {
		return c, fmt.Errorf("agent: %w", err)
	}
	c.MemTotal, c.MemAvail = parseMeminfo(mem)
	disks, err := os.ReadFile(filepath.Join(root, "diskstats"))
	if err != nil {
		return c, fmt.Errorf("agent: %w", err)
	}
	c.Disks = parseDiskstats(disks, isWholeDisk)
	vm, err := os.ReadFile(filepath.Join(root, "vmstat"))
	if err != nil {
		return c, fmt.Errorf("agent: %w", err)
	}
	c.MajorFaults, c.SwapIn, c.SwapOut = parseVmstat(vm)
	// A kernel without PSI has no /proc/pressure: both read as 0.
	if psi, err := os.ReadFile(filepath.Join(root, "pressure", "memory")); err == nil {
		c.MemSome10, c.HasPSI = parsePSI(psi), true
	}
	if psi, err := os.ReadFile(filepath.Join(root, "pressure", "cpu")); err == nil {
		c.CPUSome10 = parsePSI(psi)
	}
	return c, nil
}

// isWholeDisk keeps real block devices: not partitions, loop or RAM disks.
func isWholeDisk(name string) bool {
	if strings.HasPrefix(name, "loop") || strings.HasPrefix(name, "ram") || strings.HasPrefix(name, "zram") {
		return false
	}
	_, err := os.Stat(filepath.Join("/sys/block", name))
	return err == nil
}

func parseStat(b []byte) (busy, total uint64, err error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("agent: /proc/stat starts with %q, not the cpu line", line)
	}
	var idle uint64
	for i, s := range f[1:] {
		if i >= 8 { // guest time is already counted in user
			break
		}
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("agent: /proc/stat: %w", err)
		}
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return total - idle, total, nil
}

func parseMeminfo(b []byte) (total, avail uint64) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			total = v << 10
		case "MemAvailable:":
			avail = v << 10
		}
	}
	return total, avail
}

// parseVmstat returns the pgmajfault, pswpin and pswpout counters; one
// the kernel does not show reads as 0.
func parseVmstat(b []byte) (majfault, swapIn, swapOut uint64) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *uint64
		switch name {
		case "pgmajfault":
			dst = &majfault
		case "pswpin":
			dst = &swapIn
		case "pswpout":
			dst = &swapOut
		default:
			continue
		}
		*dst, _ = strconv.ParseUint(strings.TrimSpace(val), 10, 64)
	}
	return majfault, swapIn, swapOut
}

func parseDiskstats(b []byte, keep func(string) bool) map[string]DiskCounters {
	out := map[string]DiskCounters{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 14 || (keep != nil && !keep(f[2])) {
			continue
		}
		n := func(i int) uint64 { v, _ := strconv.ParseUint(f[i], 10, 64); return v }
		out[f[2]] = DiskCounters{IOs: n(3) + n(7), IOms: n(6) + n(10), BusyMS: n(12)}
	}
	return out
}

func parsePSI(b []byte) float64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "some" {
			continue
		}
		if v, ok := strings.CutPrefix(f[1], "avg10="); ok {
			p, _ := strconv.ParseFloat(v, 64)
			return p
		}
	}
	return 0
}

// minWindowMS is the shortest interval disk idleness, disk latency and
// page rates are judged over.
const minWindowMS = 500

// Between derives the load over the interval from a to b.
func Between(a, b Counters) Load {
	l := Load{DiskIdle: 1}
	if dt := b.CPUTotal - a.CPUTotal; dt > 0 && b.CPUTotal >= a.CPUTotal {
		l.CPU = clamp(float64(b.CPUBusy-a.CPUBusy) / float64(dt))
	}
	if b.MemTotal > 0 {
		l.Memory = clamp(1 - float64(b.MemAvail)/float64(b.MemTotal))
	}
	wall := float64(b.At.Sub(a.At).Milliseconds())
	for name, d := range b.Disks {
		p, ok := a.Disks[name]
		// The kernel counts busy time in whole ticks: over a window of a
		// few milliseconds (the heartbeat right after registering) one
		// request in flight reads as a saturated disk, which would mark a
		// new host unhealthy. Such a window says nothing of the disk.
		if !ok || wall < minWindowMS || d.BusyMS < p.BusyMS || d.IOs < p.IOs {
			continue
		}
		idle := clamp(1 - float64(d.BusyMS-p.BusyMS)/wall)
		l.DiskIdle = min(l.DiskIdle, idle)
		if n := d.IOs - p.IOs; n > 0 {
			l.DiskLatencyMS = max(l.DiskLatencyMS, float64(d.IOms-p.IOms)/float64(n))
		}
	}
	l.MemoryPressure = clamp(b.MemSome10 / 100)
	l.CPUPressure = clamp(b.CPUSome10 / 100)
	// Over a few milliseconds one fault would read as hundreds a second.
	if wall >= minWindowMS {
		l.MajorFaultsPerSec = perSec(a.MajorFaults, b.MajorFaults, wall)
		l.SwapInPerSec = perSec(a.SwapIn, b.SwapIn, wall)
		l.SwapOutPerSec = perSec(a.SwapOut, b.SwapOut, wall)
	}
	return l
}

// perSec is a cumulative counter's rate from a to b over ms milliseconds;
// a counter that went back (a reboot between readings) gives 0.
func perSec(a, b uint64, ms float64) float64 {
	if b < a {
		return 0
	}
	return float64(b-a) / ms * 1000
}

func clamp(v float64) float64 { return min(1, max(0, v)) }

// LoadWindow is the shortest time a heartbeat's load is read over, the
// span of the kernel's pressure averages (avg10). Over one heartbeat
// interval (a second, on a busy bench) a burst of writeback as a user
// logs on reads as a slow disk, and the broker would turn users away
// from a host with room: health is judged on what lasts.
const LoadWindow = 10 * time.Second

// loadWindow keeps the counter readings of the last LoadWindow, so that
// each heartbeat's load runs from the newest reading at least that old.
type loadWindow struct {
	samples []Counters
}

func newLoadWindow(first Counters) *loadWindow { return &loadWindow{samples: []Counters{first}} }

// add records cur and returns the load since the newest reading at least
// LoadWindow before it, or since the oldest kept while none is that old
// (the first heartbeats after the agent starts).
func (w *loadWindow) add(cur Counters) Load {
	base := w.samples[0]
	for _, s := range w.samples {
		if cur.At.Sub(s.At) < LoadWindow {
			break
		}
		base = s
	}
	w.samples = append(w.samples, cur)
	// Keep the newest reading at least a window old (the next base) and
	// every one after it.
	for len(w.samples) > 1 && cur.At.Sub(w.samples[1].At) >= LoadWindow {
		w.samples = w.samples[1:]
	}
	return Between(base, cur)
}
