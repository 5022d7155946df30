package sessionhost

import (
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/config"
)

func stepOf(users int, times ...float64) Step {
	return Step{Users: users, Actions: map[string][]float64{"edit": times}}
}

func TestFindDegradation(t *testing.T) {
	steps := []Step{
		stepOf(1, 100, 300), // baseline: the first two steps' actions together
		stepOf(2, 200, 200),
		stepOf(3, 1100, 1100), // 1,100 is not past 200 + 1,000
		stepOf(4, 1300, 1200), // 1,250 is
		stepOf(5, 5000),
	}
	if b := Baseline(steps, 2); b != 200 {
		t.Fatalf("baseline %v, want 200", b)
	}
	d := FindDegradation(steps, 2, 1000)
	if d.Users != 4 || !strings.Contains(d.Why, "1250 ms") {
		t.Fatalf("degradation %+v, want at 4 users with an average of 1250 ms", d)
	}
	if SuggestLimit(d) != 3 {
		t.Fatalf("suggested limit %d, want 3", SuggestLimit(d))
	}
	// The baseline steps themselves are never the point, however slow.
	if d := FindDegradation([]Step{stepOf(1, 100), stepOf(2, 9000), stepOf(3, 200)}, 2, 1000); d.Users != 0 {
		t.Fatalf("degradation %+v inside the baseline", d)
	}
	// A failed logon is the point, even while actions are fast.
	failed := []Step{stepOf(1, 100), stepOf(2, 100), {Users: 3, LogonFailed: "xfreerdp ended"}}
	if d := FindDegradation(failed, 2, 1000); d.Users != 3 || !strings.Contains(d.Why, "logon failed") {
		t.Fatalf("degradation %+v, want the failed logon at 3", d)
	}
	// Failing actions have no time: past a tenth of them, the host is
	// degraded however fast the rest were.
	failing := []Step{stepOf(1, 100), stepOf(2, 100), stepOf(3, 100, 100, 100, 100, 100, 100, 100, 100, 100), stepOf(4, 100, 100, 100, 100, 100, 100, 100, 100)}
	failing[2].Failed = map[string]int{"edit": 1} // 1 of 10: not past a tenth
	failing[3].Failed = map[string]int{"edit": 2}
	if d := FindDegradation(failing, 2, 1000); d.Users != 4 || !strings.Contains(d.Why, "2 of 10 actions failed") {
		t.Fatalf("degradation %+v, want the failing actions at 4", d)
	}
	if d := FindDegradation(steps[:3], 2, 1000); d.Users != 0 || SuggestLimit(d) != 0 {
		t.Fatalf("a ramp that never degraded: %+v, limit %d", d, SuggestLimit(d))
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{40, 10, 30, 20}
	if p := percentile(v, 50); p != 25 {
		t.Errorf("median %v, want 25", p)
	}
	if p := percentile(v, 100); p != 40 {
		t.Errorf("p100 %v", p)
	}
	if !math.IsNaN(percentile(nil, 50)) || !math.IsNaN(Step{}.Mean()) {
		t.Error("no actions must read as no figure, not 0 ms")
	}
}

func TestLimitingCounter(t *testing.T) {
	th := Thresholds(config.DefaultHealth())
	steps := []Step{
		{Users: 1, MachineCPUPct: 40, DiskIdlePct: 100, DiskLatencyMS: 30}, // a burst of writeback
		{Users: 2, MachineCPUPct: 70, DiskIdlePct: 40},                     // disk first, for good
		{Users: 3, MachineCPUPct: 95, DiskIdlePct: 30, MemUsedPct: 95},
		{Users: 4, MachineCPUPct: 95, DiskIdlePct: 30, MemUsedPct: 80},
	}
	d := Degradation{Users: 3}
	cs := Crossings(steps, th, d)
	got, over := map[string]int{}, map[string]int{}
	for _, c := range cs {
		got[c.Counter], over[c.Counter] = c.Users, c.StepsOver
	}
	if got["disk idle"] != 2 || got["cpu"] != 3 || got["memory"] != 3 || got["disk latency"] != 0 || over["disk latency"] != 1 || over["memory"] != 1 {
		t.Fatalf("crossings %v, steps over %v", got, over)
	}
	if l := Limiting(cs, d); l != "disk idle" {
		t.Errorf("limiting %q, want disk idle (crossed first)", l)
	}
	// Past the degradation point memory fell back: it still crossed by
	// then. A counter that crossed only after the degradation point does
	// not explain it.
	early := Crossings(steps, th, Degradation{Users: 2})
	for _, c := range early {
		if c.Counter == "cpu" && c.Users != 0 {
			t.Errorf("cpu crossed at %d, after the degradation point", c.Users)
		}
	}
	if l := Limiting(Crossings(steps[:1], th, Degradation{Users: 1}), Degradation{Users: 1}); l != "disk latency" {
		t.Errorf("limiting %q, want disk latency (past it at the point itself)", l)
	}
	if l := Limiting(Crossings(steps[1:2], th[:1], Degradation{Users: 2}), Degradation{Users: 2}); l != "none" {
		t.Errorf("limiting %q, want none (no counter past its threshold)", l)
	}
}

func TestParseReport(t *testing.T) {
	r, err := parseReport("tok dwload01 edit 1234", "tok")
	if err != nil || r.User != "dwload01" || r.Action != "edit" || r.MS != 1234 || r.Failed {
		t.Fatalf("%+v %v", r, err)
	}
	if r, err := parseReport("tok dwload01 search failed", "tok"); err != nil || !r.Failed {
		t.Fatalf("%+v %v", r, err)
	}
	for _, bad := range []string{"other dwload01 edit 12", "tok dwload01 edit", "tok dwload01 edit -5", "tok dwload01 edit twelve", "tok a b 1 extra"} {
		if _, err := parseReport(bad, "tok"); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestRampsMedianWorstAndSuggestion: the headline is the ramp with the
// median point, the limit is drawn from the one that degraded first, a
// ramp that never degraded counts as past every one that did, and the
// printout names every ramp's point.
func TestRampsMedianWorstAndSuggestion(t *testing.T) {
	at := func(users ...int) []Ramp {
		var rs []Ramp
		for _, u := range users {
			r := Ramp{Steps: make([]Step, max(u, 20))}
			if u > 0 {
				r.Degradation = Degradation{Users: u, Why: "slow"}
			}
			rs = append(rs, r)
		}
		return rs
	}
	for _, c := range []struct {
		points        []int
		median, worst int
	}{
		{[]int{26, 22, 24}, 2, 1},
		{[]int{0, 22, 24}, 2, 1}, // none counts last
		{[]int{0, 0, 18}, 0, 2},
		{[]int{25}, 0, 0},
		{[]int{20, 21}, 0, 0}, // even: the lower middle
	} {
		rs := at(c.points...)
		if m, w := MedianRamp(rs), WorstRamp(rs); m != c.median || w != c.worst {
			t.Errorf("points %v: median ramp %d, worst %d; want %d, %d", c.points, m, w, c.median, c.worst)
		}
	}
	text, err := Suggestion(at(26, 22, 0))
	if err != nil || !strings.Contains(text, "session_limit: 21\n") || !strings.Contains(text, "26, 22, none") {
		t.Fatalf("suggestion %q, %v; want session_limit 21 from the ramp at 22 and every point named", text, err)
	}
	if _, err := Suggestion(at(0, 0)); err == nil || !strings.Contains(err.Error(), "served 20 users without degrading") {
		t.Errorf("no ramp degraded: %v", err)
	}
}

// TestAnalyzeRamp: a ramp's point, baseline and limiting counter come
// from its own steps.
func TestAnalyzeRamp(t *testing.T) {
	steps := []Step{
		{Users: 1, Actions: map[string][]float64{"edit": {400}}, MachineCPUPct: 20, DiskIdlePct: 90},
		{Users: 2, Actions: map[string][]float64{"edit": {400}}, MachineCPUPct: 40, DiskIdlePct: 90},
		{Users: 3, Actions: map[string][]float64{"edit": {900}}, MachineCPUPct: 95, DiskIdlePct: 90},
		{Users: 4, Actions: map[string][]float64{"edit": {1500}}, MachineCPUPct: 99, DiskIdlePct: 90},
	}
	r := Analyze(steps, 2, 1000, Thresholds(config.DefaultHealth()))
	if r.Baseline != 400 || r.Degradation.Users != 4 || r.Limiting != "cpu" || len(r.Steps) != 4 {
		t.Fatalf("ramp %+v", r)
	}
}

// TestCapacityOneRuleForMedianAndWorst: users per core is the users a
// ramp held before its degradation point, for the median ramp and, under
// its own key, the worst; the two are never mixed.
func TestCapacityOneRuleForMedianAndWorst(t *testing.T) {
	ramp := func(users int) Ramp { return Ramp{Degradation: Degradation{Users: users}} }
	out := &Outcome{Ramps: []Ramp{ramp(22), ramp(19), ramp(23)}, Median: 0, Worst: 1, Degradation: Degradation{Users: 22}}
	res := &report.Result{Summary: map[string]float64{}, SummaryText: map[string]string{}}
	summarize(res, out, Options{})
	cores := float64(runtime.NumCPU())
	if got, want := res.Summary["users_per_core"], report.Round(21/cores, 1); got != want {
		t.Errorf("users_per_core %v, want the median ramp's 21 held users per core, %v", got, want)
	}
	if got, want := res.Summary["users_per_core_worst"], report.Round(18/cores, 1); got != want {
		t.Errorf("users_per_core_worst %v, want the worst ramp's 18 held users per core, %v", got, want)
	}
	runs := map[string]float64{}
	for _, p := range res.Points {
		if p.Scenario == "capacity" && p.System == "deskway" {
			runs[p.Params["run"].(string)] = p.Metrics["users"]
		}
	}
	if runs["median"] != 21 || runs["worst"] != 18 {
		t.Errorf("capacity points %v, want median 21 and worst 18", runs)
	}
}
