package faults

import "testing"

// TestSummarizeNamesItsRuns: each headline comes from the case its rule
// names (the gateway's node killed, not its control window), as the
// median and the worst run with their run numbers, never the best; the
// zero counts are summed over every run.
func TestSummarizeNamesItsRuns(t *testing.T) {
	var outs []Outcome
	for run, pct := range []float64{100, 80, 90} {
		outs = append(outs,
			Outcome{Scenario: "gateway", Case: "none (control window)", Run: run + 1, RecoverS: -1,
				Metrics: map[string]float64{"back_within_10s_pct": 100}},
			Outcome{Scenario: "gateway", Case: "kill -9 one node", Run: run + 1, RecoverS: float64(run + 5),
				Metrics: map[string]float64{"back_within_10s_pct": pct}},
			Outcome{Scenario: "stream", Case: "HA pair", Run: run + 1,
				Metrics: map[string]float64{"writes_lost": float64(run), "io_errors": 1}},
		)
	}
	sum := summarize(outs, 3)
	want := map[string]float64{
		"runs_per_scenario":          3,
		"rdp_reconnected_pct_median": 90, "rdp_reconnected_pct_median_run": 3,
		"rdp_reconnected_pct_worst": 80, "rdp_reconnected_pct_worst_run": 2,
		"rdp_recover_s_median": 6, "rdp_recover_s_worst": 7, "rdp_recover_s_worst_run": 3,
		"writes_lost":                 0 + 1 + 2,
		"stream_clients_io_errors_ha": 3,
	}
	for k, v := range want {
		if got, ok := sum[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	if _, ok := sum["launches_lost"]; ok {
		t.Errorf("launches_lost is in the summary though no scenario counted it: %v", sum)
	}
}
