package faults

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// Select resolves --scenario's names ("all" is every scenario) to the
// scenarios, in the order Scenarios lists them.
func Select(names []string) ([]Scenario, error) {
	all := Scenarios()
	var known []string
	for _, s := range all {
		known = append(known, s.Name)
	}
	want := map[string]bool{}
	for _, n := range names {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
		case n == "all":
			for _, k := range known {
				want[k] = true
			}
		case slices.Contains(known, n):
			want[n] = true
		default:
			return nil, fmt.Errorf("faults: there is no scenario %q; there are %s, or all", n, strings.Join(known, ", "))
		}
	}
	var out []Scenario
	for _, s := range all {
		if want[s.Name] {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("faults: name a scenario: %s, or all", strings.Join(known, ", "))
	}
	return out, nil
}

// Bench runs runs rounds of the named scenarios, interleaved (run 1 of
// every scenario, then run 2, ...), so that a machine that slows down
// over the bench weighs on every scenario alike, and writes result.json
// and result.md into out (when it is not empty). A scenario run that
// fails ends the bench: every scenario must have the same runs.
func Bench(ctx context.Context, env Env, names []string, runs int, out string) (*report.Result, error) {
	scenarios, err := Select(names)
	if err != nil {
		return nil, err
	}
	if runs < 1 {
		return nil, fmt.Errorf("faults: %d runs: give at least one", runs)
	}
	var picked []string
	for _, s := range scenarios {
		picked = append(picked, s.Name)
	}
	command := fmt.Sprintf("deskway bench faults --scenario %s --runs %d --out %s", strings.Join(picked, ","), runs, out)
	if env.Small {
		command += " --small"
	}
	res := &report.Result{Bench: "faults", Started: time.Now().UTC(), Machine: report.ThisMachine(), Command: command}
	var outcomes []Outcome
	for run := 1; run <= runs; run++ {
		for _, s := range scenarios {
			env.Log.Info("fault scenario", "scenario", s.Name, "run", run, "of", runs)
			work, err := os.MkdirTemp(env.Work, s.Name+"-")
			if err != nil {
				return nil, fmt.Errorf("faults: %w", err)
			}
			senv := env
			senv.Work = work
			got, err := s.Run(ctx, senv, run)
			os.RemoveAll(work)
			if err != nil {
				return nil, err
			}
			for i := range got {
				got[i].Scenario, got[i].Run = s.Name, run
			}
			outcomes = append(outcomes, got...)
		}
	}
	for _, o := range outcomes {
		m := map[string]float64{"users": float64(o.Users), "affected": float64(o.Affected), "recover_s": report.Round(o.RecoverS, 3)}
		for k, v := range o.Metrics {
			m[k] = report.Round(v, 3)
		}
		res.Points = append(res.Points, report.Point{Scenario: o.Scenario, System: "deskway",
			Params: map[string]any{"case": o.Case, "run": o.Run, "load": o.Load, "held": o.Held, "notes": o.Notes}, Metrics: m})
	}
	res.Summary = summarize(outcomes, runs)
	res.Notes = notes(scenarios)
	if out == "" {
		return res, nil
	}
	if err := res.WriteJSON(out); err != nil {
		return nil, err
	}
	if err := os.WriteFile(out+"/result.md", []byte(markdown(res, outcomes, scenarios, runs)), 0o644); err != nil {
		return nil, fmt.Errorf("faults: %w", err)
	}
	return res, nil
}

// zeroKeys are the summary's counts that must be 0: each is the sum of
// the metric of that name over every run of every case that reports it.
var zeroKeys = []string{"writes_lost", "launches_lost", "launches_doubled", "wrong_disks"}

// summaryRule makes one headline figure out of one case's runs.
type summaryRule struct {
	key      string
	scenario string
	// caseN picks the scenario's case by the order it runs them in (0:
	// the first).
	caseN  int
	metric string // "recover_s" is Outcome.RecoverS (0 when service did not stop)
	worst  string // "max" or "min": which end is the worst run
	sum    bool   // the sum over runs, in place of the worst run
}

// summaryRules are the faults row of docs/benchmarks' summary keys (see
// the design's BENCH.md) beyond zeroKeys. Each *_worst key comes with a
// *_median key and the run each was measured in.
func summaryRules() []summaryRule {
	return []summaryRule{
		{key: "broker_recover_s", scenario: "broker", caseN: 0, metric: "recover_s", worst: "max"},
		{key: "broker_db_recover_s", scenario: "broker", caseN: 1, metric: "recover_s", worst: "max"},
		// The gateway scenario's first case is its control window; the
		// second is the node killed.
		{key: "rdp_reconnected_pct", scenario: "gateway", caseN: 1, metric: "back_within_10s_pct", worst: "min"},
		{key: "rdp_recover_s", scenario: "gateway", caseN: 1, metric: "recover_s", worst: "max"},
		// The part of it before the session host's: the fault to the RDP
		// connection up again through the other node.
		{key: "rdp_connected_pct", scenario: "gateway", caseN: 1, metric: "connected_within_10s_pct", worst: "min"},
		{key: "rdp_connected_s", scenario: "gateway", caseN: 1, metric: "connected_worst_s", worst: "max"},
		{key: "stream_clients_io_errors_ha", scenario: "stream", caseN: 0, metric: "io_errors", sum: true},
	}
}

func metricOf(o Outcome, name string) (float64, bool) {
	if name == "recover_s" {
		return max(o.RecoverS, 0), true
	}
	v, ok := o.Metrics[name]
	return v, ok
}

// caseRuns groups outcomes by scenario and case, cases in the order
// they first ran.
func caseRuns(outcomes []Outcome) (order []string, runs map[string][]Outcome) {
	runs = map[string][]Outcome{}
	for _, o := range outcomes {
		k := o.Scenario + "\x00" + o.Case
		if _, ok := runs[k]; !ok {
			order = append(order, k)
		}
		runs[k] = append(runs[k], o)
	}
	return order, runs
}

// nthCase is the outcomes of scenario's n-th case.
func nthCase(outcomes []Outcome, scenario string, n int) []Outcome {
	order, runs := caseRuns(outcomes)
	i := 0
	for _, k := range order {
		if strings.HasPrefix(k, scenario+"\x00") {
			if i == n {
				return runs[k]
			}
			i++
		}
	}
	return nil
}

// medianWorst picks the median run and the worst run of runs by value
// (worst is "max" or "min"); with an even count the median is the worse
// of the middle two.
func medianWorst(runs []Outcome, value func(Outcome) float64, worst string) (median, worstRun Outcome) {
	s := append([]Outcome(nil), runs...)
	sort.SliceStable(s, func(i, j int) bool { return value(s[i]) < value(s[j]) })
	if worst == "min" {
		slices.Reverse(s)
	}
	return s[len(s)/2], s[len(s)-1]
}

func summarize(outcomes []Outcome, runs int) map[string]float64 {
	sum := map[string]float64{"runs_per_scenario": float64(runs)}
	for _, k := range zeroKeys {
		seen := false
		total := 0.0
		for _, o := range outcomes {
			if v, ok := o.Metrics[k]; ok {
				seen, total = true, total+v
			}
		}
		if seen {
			sum[k] = total
		}
	}
	for _, r := range summaryRules() {
		var have []Outcome
		for _, o := range nthCase(outcomes, r.scenario, r.caseN) {
			if _, ok := metricOf(o, r.metric); ok {
				have = append(have, o)
			}
		}
		if len(have) == 0 {
			continue
		}
		value := func(o Outcome) float64 { v, _ := metricOf(o, r.metric); return v }
		if r.sum {
			total := 0.0
			for _, o := range have {
				total += value(o)
			}
			sum[r.key] = total
			continue
		}
		med, worst := medianWorst(have, value, r.worst)
		sum[r.key+"_median"] = report.Round(value(med), 3)
		sum[r.key+"_median_run"] = float64(med.Run)
		sum[r.key+"_worst"] = report.Round(value(worst), 3)
		sum[r.key+"_worst_run"] = float64(worst.Run)
	}
	return sum
}
