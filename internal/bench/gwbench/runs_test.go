package gwbench

import (
	"slices"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/bench/load"
)

// crossingAt is a ramp whose p99 (added and own) crosses 40 ms at c
// tunnels, 1,000 < c < 2,000, as maxUnder interpolates it.
func crossingAt(sys string, c float64) ramp {
	return ramp{system: sys, steps: []step{
		{Stats: load.Stats{Tunnels: 1000}},
		{Stats: load.Stats{Tunnels: 2000, P99ms: 40 * 1000 / (c - 1000)}, AddedP99: 40 * 1000 / (c - 1000)},
	}}
}

// never is a direct ramp that stays under 40 ms.
func never() ramp {
	return ramp{system: "direct", steps: []step{{Stats: load.Stats{Tunnels: 1000, P99ms: 1}}, {Stats: load.Stats{Tunnels: 2000, P99ms: 2}}}}
}

// TestSummarizeKWTakesRatiosWithinRuns: the headline is each system's
// median run with its spread, and the ratio to HAProxy is the median of
// per-run ratios, whose worst run is named too. The medians of the counts
// are equal here (1,500 and 1,500), yet deskway beat HAProxy in two runs
// of three: a ratio of medians (1.0) would hide both that and the bad run.
func TestSummarizeKWTakesRatiosWithinRuns(t *testing.T) {
	var runs []map[string]ramp
	for _, c := range [][2]float64{{1500, 1250}, {1800, 1500}, {1250, 1800}} {
		runs = append(runs, map[string]ramp{"deskway": crossingAt("deskway", c[0]), "haproxy": crossingAt("haproxy", c[1]), "direct": never()})
	}
	sum := map[string]float64{}
	summarizeKW(sum, "kw1", runs)
	want := map[string]float64{
		"kw1_max_tunnels_40ms": 1500, "kw1_max_tunnels_40ms_min": 1250, "kw1_max_tunnels_40ms_max": 1800,
		"haproxy_kw1_max_tunnels_40ms": 1500,
		"kw1_ratio_haproxy_median":     1.2, "kw1_ratio_haproxy_worst": 0.694,
		"direct_kw1_max_tunnels_40ms": 2000, "direct_kw1_lower_bound": 1,
		"kw1_ratio_direct_median": 0.75, "kw1_ratio_direct_worst": 0.625,
	}
	for k, v := range want {
		if sum[k] != v {
			t.Errorf("%s = %v, want %v", k, sum[k], v)
		}
	}
}

// TestSummarizeLoadsComparesEqualLoads: CPU per round trip and memory per
// tunnel come from the steps at exactly the equal loads, and the CPU ratio's
// worst run is its largest (less CPU is better).
func TestSummarizeLoadsComparesEqualLoads(t *testing.T) {
	at := func(sys string, cpu float64, rss int64) ramp {
		return ramp{system: sys, idle: 10 << 20, steps: []step{
			{Stats: load.Stats{Tunnels: 500, RoundTrips: 100}, CPUusRT: 999, RSS: 11 << 20},
			{Stats: load.Stats{Tunnels: 1000, RoundTrips: 100}, CPUusRT: cpu, RSS: rss},
		}}
	}
	var runs []map[string]ramp
	for _, c := range [][2]float64{{20, 25}, {30, 20}, {25, 30}} {
		runs = append(runs, map[string]ramp{
			"deskway": at("deskway", c[0], 10<<20+1000*40<<10),
			"haproxy": at("haproxy", c[1], 10<<20+1000*30<<10),
		})
	}
	sum := map[string]float64{}
	summarizeLoads(sum, runs, []int{1000, 2000})
	want := map[string]float64{
		"kw1_cpu_us_per_roundtrip": 25, "haproxy_kw1_cpu_us_per_roundtrip": 25,
		"kw1_cpu_us_per_roundtrip_at_1000": 25, "kw1_cpu_runs_at_1000": 3,
		"kw1_cpu_ratio_haproxy_at_1000_median": 0.833, "kw1_cpu_ratio_haproxy_at_1000_worst": 1.5,
		"bytes_per_tunnel": 40 << 10, "haproxy_bytes_per_tunnel": 30 << 10,
		"kw1_projected_tunnels_per_core": 4000,
	}
	for k, v := range want {
		if sum[k] != v {
			t.Errorf("%s = %v, want %v", k, sum[k], v)
		}
	}
	// No ramp reached 2,000 tunnels: nothing may be claimed there.
	for k := range sum {
		if strings.Contains(k, "_at_2000") {
			t.Errorf("%s claimed without a step at 2,000 tunnels", k)
		}
	}
}

func TestSummarizeThroughput(t *testing.T) {
	runs := []map[string]float64{
		{"deskway/1": 8, "direct/1": 10, "haproxy/1": 6, "deskway/8": 9, "direct/8": 15, "haproxy/8": 10},
		{"deskway/1": 6, "direct/1": 10, "haproxy/1": 7, "deskway/8": 8, "direct/8": 14, "haproxy/8": 7},
		{"deskway/1": 7, "direct/1": 8, "haproxy/1": 8, "deskway/8": 10, "direct/8": 16, "haproxy/8": 9},
	}
	sum := map[string]float64{}
	summarizeThroughput(sum, runs)
	want := map[string]float64{
		"throughput_single_gbps": 7, "throughput_single_gbps_min": 6, "throughput_single_gbps_max": 8,
		"throughput_single_ratio_direct": 0.8, "throughput_single_ratio_direct_worst": 0.6,
		"haproxy_throughput_multi_gbps": 9, "throughput_multi_ratio_haproxy_median": 1.111, "throughput_multi_ratio_haproxy_worst": 0.9,
	}
	for k, v := range want {
		if sum[k] != v {
			t.Errorf("%s = %v, want %v", k, sum[k], v)
		}
	}
}

func TestCheckSuitesRefusesMixedCiphers(t *testing.T) {
	r := &runner{suites: map[string]string{"deskway": "TLS 1.3 TLS_AES_128_GCM_SHA256", "direct": "TLS 1.3 TLS_AES_128_GCM_SHA256"}}
	if err := r.checkSuites(); err != nil {
		t.Fatal(err)
	}
	r.suites["haproxy"] = "TLS 1.3 TLS_AES_256_GCM_SHA384"
	err := r.checkSuites()
	if err == nil || !strings.Contains(err.Error(), "haproxy") {
		t.Fatalf("mixed ciphers accepted: %v", err)
	}
}

func TestMergeSteps(t *testing.T) {
	got := mergeSteps([]int{100, 1000, 3000}, []int{2000, 1000})
	if want := []int{100, 1000, 2000, 3000}; !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}
