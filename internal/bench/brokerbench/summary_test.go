package brokerbench

import (
	"testing"

	"github.com/deskway/deskway/internal/bench/report"
)

// TestSummaryNamesTheMaximumApartFromTheFixedPoint: the 60-concurrency
// point and the highest rate are different figures with different keys.
func TestSummaryNamesTheMaximumApartFromTheFixedPoint(t *testing.T) {
	pt := func(system string, rtt, c int, rate float64) report.Point {
		return report.Point{Scenario: "launch-storm", System: system, Params: map[string]any{"rtt_ms": rtt, "concurrency": c},
			Metrics: map[string]float64{"launches_per_s": rate}}
	}
	res := &report.Result{Summary: map[string]float64{}, Points: []report.Point{
		pt("deskway-postgres", 10, 48, 1332.167), pt("deskway-postgres", 10, 60, 1316.111),
		pt("deskway-sqlite", 10, 36, 5000), pt("deskway-postgres", 250, 60, 224.83),
	}}
	summarize(res)
	want := map[string]float64{
		"rtt10_c60_launches_per_s": 1316.11, "rtt10_max_launches_per_s": 1332.17, "rtt10_max_at_concurrency": 48,
		"rtt250_max_launches_per_s": 224.83, "rtt250_max_at_concurrency": 60,
	}
	for k, v := range want {
		if res.Summary[k] != v {
			t.Errorf("%s = %v, want %v (summary %v)", k, res.Summary[k], v, res.Summary)
		}
	}
}
