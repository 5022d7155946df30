package bootstorm

import (
	"slices"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// TestSummaryNamesWorstRuns: a step counts as free of slow requests only
// when every run of it, and of every smaller step, had none; ratios keep
// the worst step.
func TestSummaryNamesWorstRuns(t *testing.T) {
	pt := func(sys string, n int, slow, slowMax, boot float64) report.Point {
		return report.Point{Scenario: "storm", System: sys, Params: map[string]any{"clients": n, "runs": 3},
			Metrics: map[string]float64{"slow_requests": slow, "slow_requests_max": slowMax, "failed_clients_max": 0,
				"boot_median_s": boot, "rss_per_client_bytes": 2e6, "rss_beyond_cache_per_client_bytes": 6e4,
				"cpu_s": boot / 2, "cpu_s_max": boot}}
	}
	r := &runner{o: Options{Clients: []int{100, 250, 500}}, res: &report.Result{Summary: map[string]float64{}, Points: []report.Point{
		pt("deskway", 100, 0, 0, 10), pt("deskway", 250, 0, 7, 12), pt("deskway", 500, 0, 0, 15),
		pt(floorName, 100, 0, 0, 10), pt(floorName, 250, 1, 2, 10), pt(floorName, 500, 0, 0, 12),
		pt("nbdkit-cow", 100, 50, 60, 30), pt("nbdkit-cow", 250, 80, 90, 40), pt("nbdkit-cow", 500, 3, 9, 50),
	}}}
	r.summarize([]system{{name: "deskway"}, {name: "nbdkit-cow"}, {name: floorName}})
	s := r.res.Summary
	// The median run at 250 had none, but the worst had 7: 100 is the
	// answer, not 500 (which a max over median runs would say).
	if s["max_clients_no_slow_requests"] != 100 {
		t.Fatalf("max_clients_no_slow_requests = %v, want 100", s["max_clients_no_slow_requests"])
	}
	if s["boot_ratio_floor_max"] != 1.25 || s["slow_ratio_floor_max"] != 1 || s["slow_ratio_best_peer_max"] != 0.25 {
		t.Fatalf("ratios: %v", s)
	}
	// Worst runs against worst runs: deskway's 7 at 250 against the
	// floor's 2 is (7+1)/(2+1); against the best peer the worst step is
	// 500, deskway's none against its 9: 1/10.
	if s["slow_ratio_floor_max_worst_run"] != 2.667 || s["slow_ratio_best_peer_max_worst_run"] != 0.1 {
		t.Fatalf("worst-run ratios: %v", s)
	}
	// CPU-seconds, median run by that figure and worst against worst:
	// the worst step is 500 (15 against 12).
	if s["cpu_ratio_floor_max"] != 1.25 || s["cpu_ratio_floor_max_worst_run"] != 1.25 {
		t.Fatalf("CPU ratios: %v", s)
	}
	if s["rss_bytes_per_client"] != 2e6 || s["rss_bytes_per_client_excl_cache"] != 6e4 {
		t.Fatalf("memory: %v", s)
	}
}

// TestSlowWhenCountsKindsAndTheBusiestSpan: slow requests are counted by
// what they asked, and the storm's busiest 5 s is found with its share.
func TestSlowWhenCountsKindsAndTheBusiestSpan(t *testing.T) {
	s := time.Second
	results := []clientResult{
		{slowCmd: [3]int{2, 1, 0}, slowAt: []time.Duration{1 * s, 12 * s, 13 * s}},
		{slowCmd: [3]int{1, 0, 1}, slowAt: []time.Duration{11 * s, 14 * s}},
		{}, // a client with none
	}
	m := map[string]float64{}
	buckets := slowWhen(results, m)
	if m["slow_reads"] != 3 || m["slow_writes"] != 1 || m["slow_flushes"] != 1 {
		t.Fatalf("by kind: %v", m)
	}
	if m["slow_peak_at_s"] != 10 || m["slow_peak_share"] != 0.8 {
		t.Fatalf("busiest span: %v", m)
	}
	if want := []int{1, 0, 4}; !slices.Equal(buckets, want) {
		t.Fatalf("per 5 s: %v, want %v", buckets, want)
	}
	if got := slowKind('Z'); got != 1 {
		t.Fatalf("write zeroes counted as kind %d, want a write", got)
	}
}
