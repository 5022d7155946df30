package sessionhost

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/deskway/deskway/internal/config"
)

// Step is what one step of a ramp measured: the users logged on, the
// actions their sessions completed during the step's window, and the
// host's counters over that window.
type Step struct {
	Users int
	// LogonS is how long the step's new user took from starting the
	// client to the workload's first report; LogonFailed says it never
	// reported (or the broker placed it nowhere, in a broker ramp).
	LogonS      float64
	LogonFailed string
	// Actions are the times (ms) of the actions completed in the window,
	// by action; Failed counts actions whose check failed, by action.
	Actions map[string][]float64
	Failed  map[string]int
	// Counters over the window.
	MachineCPUPct    float64 // every process on the machine, % of all cores
	ClientCPUPct     float64 // the xfreerdp clients and their X server
	GatewayCPUPct    float64
	HostCPUPct       float64 // the machine less clients, gateway and bench: the session host's share
	MemUsedPct       float64
	MemPerSession    float64 // bytes: average proportional set size of a session's processes
	DiskIdlePct      float64
	DiskLatencyMS    float64
	MemPressurePct   float64
	CPUPressurePct   float64 // share of the window's last 10 s some runnable task waited for a CPU
	MajorFaultsPerS  float64
	SwapInPerS       float64
	SwapOutPerS      float64
	SessionsMeasured int
	// Placed is, in a broker ramp, whether the broker placed this step's
	// user on the host.
	Placed bool
}

// failed is how many of the step's actions failed.
func (s Step) failed() int {
	n := 0
	for _, f := range s.Failed {
		n += f
	}
	return n
}

// all is every action time of the step.
func (s Step) all() []float64 {
	var out []float64
	for _, ts := range s.Actions {
		out = append(out, ts...)
	}
	return out
}

// Mean is the step's average action time: the figure VSImax and the
// Terminal Server paper watch.
func (s Step) Mean() float64 { return mean(s.all()) }

// Percentile is the p-th percentile (0-100) of the step's action times.
func (s Step) Percentile(p float64) float64 { return percentile(s.all(), p) }

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

// percentile interpolates between the nearest ranks.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	r := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(r))
	hi := int(math.Ceil(r))
	return s[lo] + (s[hi]-s[lo])*(r-float64(lo))
}

// Baseline is the average action time of the first n steps' actions
// taken together: the host with its first users, before any of them
// contends for it.
func Baseline(steps []Step, n int) float64 {
	var v []float64
	for i := 0; i < n && i < len(steps); i++ {
		v = append(v, steps[i].all()...)
	}
	return mean(v)
}

// Degradation is where a ramp stopped serving users well.
type Degradation struct {
	// Users is the user count of the first step past the threshold, 0
	// when no step was.
	Users int
	// Why says which: the average action time, or a logon that failed.
	Why string
}

// FindDegradation is the first step after the baseline's whose average
// action time passes baseline + addMS, or more than a tenth of whose
// actions failed (a failed action has no time, and would otherwise keep
// a failing host's average low), or whose user failed to log on.
func FindDegradation(steps []Step, baselineSteps int, addMS float64) Degradation {
	base := Baseline(steps, baselineSteps)
	for i, s := range steps {
		if s.LogonFailed != "" {
			return Degradation{Users: s.Users, Why: "logon failed: " + s.LogonFailed}
		}
		if i < baselineSteps {
			continue
		}
		if f, n := s.failed(), len(s.all()); f*10 > f+n {
			return Degradation{Users: s.Users, Why: fmt.Sprintf("%d of %d actions failed", f, f+n)}
		}
		if m := s.Mean(); m > base+addMS {
			return Degradation{Users: s.Users, Why: fmt.Sprintf("average action %.0f ms > baseline %.0f ms + %.0f ms", m, base, addMS)}
		}
	}
	return Degradation{}
}

// Threshold is a counter's limit, past which it explains slow actions.
type Threshold struct {
	Counter string
	// Over reports whether the step's counter is past the limit, and its
	// value.
	Over func(Step) (bool, float64)
	// Limit says the limit in words, for the report.
	Limit string
}

// Thresholds are the counters the Terminal Server paper sizes hosts by,
// with the limits its guidance and the broker's health thresholds h
// set: processors near saturation or tasks waiting for them, memory
// nearly all in use or stalling tasks, disks busy more than half the
// time or slow, and paging.
func Thresholds(h config.Health) []Threshold {
	return []Threshold{
		{"cpu", func(s Step) (bool, float64) { return s.MachineCPUPct >= 90, s.MachineCPUPct }, "processors ≥ 90 % busy"},
		{"cpu pressure", func(s Step) (bool, float64) { return s.CPUPressurePct > h.CPUPressureMaxPct, s.CPUPressurePct },
			fmt.Sprintf("tasks waiting for a CPU > %.0f %% of the time", h.CPUPressureMaxPct)},
		{"memory", func(s Step) (bool, float64) { return s.MemUsedPct >= 90, s.MemUsedPct }, "memory ≥ 90 % in use"},
		{"memory pressure", func(s Step) (bool, float64) { return s.MemPressurePct > h.MemoryPressureMaxPct, s.MemPressurePct },
			fmt.Sprintf("tasks stalled on memory > %.0f %% of the time", h.MemoryPressureMaxPct)},
		{"paging", func(s Step) (bool, float64) { return s.MajorFaultsPerS > 100 || s.SwapInPerS > 10, s.MajorFaultsPerS },
			"> 100 major page faults/s or > 10 pages/s swapped in"},
		{"disk idle", func(s Step) (bool, float64) { return s.DiskIdlePct < h.DiskIdleMinPct, s.DiskIdlePct },
			fmt.Sprintf("busiest disk idle < %.0f %%", h.DiskIdleMinPct)},
		{"disk latency", func(s Step) (bool, float64) { return s.DiskLatencyMS > h.DiskLatencyMaxMS, s.DiskLatencyMS },
			fmt.Sprintf("> %.0f ms per disk request", h.DiskLatencyMaxMS)},
	}
}

// Crossing is where a counter passed its threshold for good.
type Crossing struct {
	Counter string
	// Users is the first step from which the counter stayed past its
	// threshold through the degradation point (or the ramp's end); 0:
	// never. A single step past it (a burst of writeback, a logon) does
	// not explain a host that degrades later.
	Users int
	Value float64
	// StepsOver counts every step past the threshold, sustained or not.
	StepsOver int
}

// Crossings lists, for each threshold, where the counter crossed it for
// good before the degradation point d (0: the whole ramp).
func Crossings(steps []Step, th []Threshold, d Degradation) []Crossing {
	out := make([]Crossing, 0, len(th))
	for _, t := range th {
		c := Crossing{Counter: t.Counter}
		for _, s := range steps {
			if s.LogonFailed != "" {
				continue
			}
			over, v := t.Over(s)
			if over {
				c.StepsOver++
			}
			if d.Users > 0 && s.Users > d.Users {
				continue
			}
			switch {
			case over && c.Users == 0:
				c.Users, c.Value = s.Users, v
			case !over:
				c.Users, c.Value = 0, 0
			}
		}
		out = append(out, c)
	}
	return out
}

// Limiting is the counter that crossed its threshold first, at or
// before the degradation point (the one that explains it), or "none"
// when no counter did: the time went somewhere the counters do not see.
func Limiting(cs []Crossing, d Degradation) string {
	best := Crossing{}
	for _, c := range cs {
		if c.Users == 0 || (d.Users > 0 && c.Users > d.Users) {
			continue
		}
		if best.Users == 0 || c.Users < best.Users {
			best = c
		}
	}
	if best.Users == 0 {
		return "none"
	}
	return best.Counter
}

// SuggestLimit is the session limit for a host like the one measured:
// the largest user count that still served users well, that is one
// below the degradation point; 0 when the ramp never degraded (no limit
// can be drawn from it).
func SuggestLimit(d Degradation) int {
	if d.Users <= 1 {
		return 0
	}
	return d.Users - 1
}

// Ramp is one measuring ramp and what it found.
type Ramp struct {
	Steps       []Step
	Baseline    float64
	Degradation Degradation
	Crossings   []Crossing
	Limiting    string
}

// Analyze finds a measured ramp's baseline, degradation point and
// limiting counter, with the thresholds th.
func Analyze(steps []Step, baselineSteps int, addMS float64, th []Threshold) Ramp {
	r := Ramp{Steps: steps, Baseline: Baseline(steps, baselineSteps), Degradation: FindDegradation(steps, baselineSteps, addMS)}
	r.Crossings = Crossings(steps, th, r.Degradation)
	r.Limiting = Limiting(r.Crossings, r.Degradation)
	return r
}

// point orders ramps by degradation point, a ramp that never degraded
// after every one that did.
func (r Ramp) point() int {
	if r.Degradation.Users == 0 {
		return math.MaxInt
	}
	return r.Degradation.Users
}

// MedianRamp is the index of the ramp whose degradation point is the
// median (the lower middle one of an even count): the run's headline.
func MedianRamp(ramps []Ramp) int {
	idx := make([]int, len(ramps))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return ramps[idx[a]].point() < ramps[idx[b]].point() })
	return idx[(len(idx)-1)/2]
}

// WorstRamp is the index of the ramp that degraded first: the one a
// session limit must hold for.
func WorstRamp(ramps []Ramp) int {
	w := 0
	for i, r := range ramps {
		if r.point() < ramps[w].point() {
			w = i
		}
	}
	return w
}

// Suggestion is what --suggest-limit prints for ramps: the
// delivery-group setting for a host like the one measured, drawn from
// the ramp that degraded first; an error when none degraded.
func Suggestion(ramps []Ramp) (string, error) {
	w := ramps[WorstRamp(ramps)]
	limit := SuggestLimit(w.Degradation)
	if limit == 0 {
		most := 0
		for _, r := range ramps {
			most = max(most, len(r.Steps))
		}
		if w.Degradation.Users == 1 {
			return "", fmt.Errorf("the first user already passed the degradation threshold (%s): no limit can be drawn", w.Degradation.Why)
		}
		return "", fmt.Errorf("the host served %d users without degrading in every ramp: ramp further (--users) before drawing a limit from it", most)
	}
	points := make([]string, len(ramps))
	for i, r := range ramps {
		points[i] = "none"
		if r.Degradation.Users > 0 {
			points[i] = fmt.Sprint(r.Degradation.Users)
		}
	}
	return fmt.Sprintf("# degradation points of %d ramp(s): %s; the first came at %d users.\n# a host like this one holds %d users; in the delivery group:\nsession_limit: %d\n",
		len(ramps), strings.Join(points, ", "), w.Degradation.Users, limit, limit), nil
}
