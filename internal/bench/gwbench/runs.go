package gwbench

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"

	"github.com/deskway/deskway/internal/bench/report"
)

// median of xs: the middle run for an odd count (the default three), the
// mean of the middle two for an even one.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread writes key (the median), key_min and key_max.
func spread(sum map[string]float64, key string, xs []float64, d int) {
	if len(xs) == 0 {
		return
	}
	sum[key] = report.Round(median(xs), d)
	sum[key+"_min"] = report.Round(slices.Min(xs), d)
	sum[key+"_max"] = report.Round(slices.Max(xs), d)
}

// ratios writes key_median and key_worst over per-run ratios a[i]/b[i],
// each ratio taken within one run; worst is the smallest when a higher
// ratio is better, else the largest.
func ratios(sum map[string]float64, key string, a, b []float64, higherBetter bool) {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return
	}
	sum[key+"_median"] = report.Round(median(rs), 3)
	worst := slices.Max(rs)
	if higherBetter {
		worst = slices.Min(rs)
	}
	sum[key+"_worst"] = report.Round(worst, 3)
}

// mergeSteps adds the equal-load tunnel counts to a ramp's steps.
func mergeSteps(steps, loads []int) []int {
	out := slices.Concat(steps, loads)
	slices.Sort(out)
	return slices.Compact(out)
}

// summarizeKW writes a knowledge-worker pattern's headline figures from
// its runs: each system's 40 ms count as median with min and max, and
// deskway's ratios to HAProxy and to the direct path, each taken within
// one run, as median and worst.
func summarizeKW(sum map[string]float64, name string, runs []map[string]ramp) {
	var dk, hp, dr []float64
	directNeverCrossed := false
	for _, rs := range runs {
		n, _ := maxUnder(rs["deskway"].steps, func(s step) float64 { return s.AddedP99 }, thresholdMs)
		dk = append(dk, math.Round(n))
		d, crossed := maxUnder(rs["direct"].steps, func(s step) float64 { return s.P99ms }, thresholdMs)
		dr = append(dr, math.Round(d))
		directNeverCrossed = directNeverCrossed || !crossed
		if h, ok := rs["haproxy"]; ok {
			n, _ := maxUnder(h.steps, func(s step) float64 { return s.AddedP99 }, thresholdMs)
			hp = append(hp, math.Round(n))
		}
	}
	spread(sum, name+"_max_tunnels_40ms", dk, 0)
	spread(sum, "direct_"+name+"_max_tunnels_40ms", dr, 0)
	if directNeverCrossed {
		// The direct path's count is then a lower bound, and deskway's
		// ratio to it an upper bound.
		sum["direct_"+name+"_lower_bound"] = 1
	}
	ratios(sum, name+"_ratio_direct", dk, dr, true)
	if len(hp) > 0 {
		spread(sum, "haproxy_"+name+"_max_tunnels_40ms", hp, 0)
		ratios(sum, name+"_ratio_haproxy", dk, hp, true)
	}
}

// atLoad is a ramp's step at n tunnels, if the ramp reached it without
// errors.
func atLoad(rp ramp, n int) (step, bool) {
	for _, s := range rp.steps {
		if s.Tunnels == n && s.Errors == 0 && s.RoundTrips > 0 && s.RSS > 0 {
			return s, true
		}
	}
	return step{}, false
}

// summarizeLoads writes CPU per round trip and memory per tunnel for
// deskway and HAProxy at each equal load, medians over runs, with
// deskway's per-run CPU ratio to HAProxy as median and worst. The first
// load also gives the bench's standard keys.
func summarizeLoads(sum map[string]float64, runs []map[string]ramp, loads []int) {
	for i, n := range loads {
		cpu := map[string][]float64{}
		mem := map[string][]float64{}
		var pairD, pairH []float64
		for _, rs := range runs {
			for _, sys := range []string{"deskway", "haproxy"} {
				rp, ok := rs[sys]
				if !ok {
					continue
				}
				if s, ok := atLoad(rp, n); ok {
					cpu[sys] = append(cpu[sys], s.CPUusRT)
					if rp.idle > 0 {
						mem[sys] = append(mem[sys], math.Round(float64(s.RSS-rp.idle)/float64(n)))
					}
				}
			}
			d, okD := atLoad(rs["deskway"], n)
			h, okH := atLoad(rs["haproxy"], n)
			if okD && okH {
				pairD, pairH = append(pairD, d.CPUusRT), append(pairH, h.CPUusRT)
			}
		}
		at := fmt.Sprintf("_at_%d", n)
		for sys, prefix := range map[string]string{"deskway": "", "haproxy": "haproxy_"} {
			if len(cpu[sys]) > 0 {
				sum[prefix+"kw1_cpu_us_per_roundtrip"+at] = report.Round(median(cpu[sys]), 2)
				sum[prefix+"kw1_cpu_runs"+at] = float64(len(cpu[sys]))
				if i == 0 {
					sum[prefix+"kw1_cpu_us_per_roundtrip"] = report.Round(median(cpu[sys]), 2)
				}
			}
			if len(mem[sys]) > 0 {
				sum[prefix+"bytes_per_tunnel"+at] = median(mem[sys])
				if i == 0 {
					sum[prefix+"bytes_per_tunnel"] = median(mem[sys])
				}
			}
		}
		ratios(sum, "kw1_cpu_ratio_haproxy"+at, pairD, pairH, false)
		if i == 0 && len(cpu["deskway"]) > 0 && median(cpu["deskway"]) > 0 {
			sum["kw1_projected_tunnels_per_core"] = math.Round(1e6 / (median(cpu["deskway"]) * 10))
		}
	}
}

// summarizeThroughput writes each system's Gbit/s as the median run and
// deskway's ratios to the direct path and HAProxy, each within one run.
func summarizeThroughput(sum map[string]float64, runs []map[string]float64) {
	col := func(k string) []float64 {
		var xs []float64
		for _, g := range runs {
			if v, ok := g[k]; ok {
				xs = append(xs, v)
			}
		}
		return xs
	}
	for streams, name := range map[int]string{1: "single", 8: "multi"} {
		d, dr, hp := col(fmt.Sprintf("deskway/%d", streams)), col(fmt.Sprintf("direct/%d", streams)), col(fmt.Sprintf("haproxy/%d", streams))
		spread(sum, "throughput_"+name+"_gbps", d, 3)
		spread(sum, "direct_throughput_"+name+"_gbps", dr, 3)
		r := map[string]float64{}
		ratios(r, "x", d, dr, true)
		sum["throughput_"+name+"_ratio_direct"] = r["x_median"]
		sum["throughput_"+name+"_ratio_direct_worst"] = r["x_worst"]
		if len(hp) > 0 {
			spread(sum, "haproxy_throughput_"+name+"_gbps", hp, 3)
			ratios(sum, "throughput_"+name+"_ratio_haproxy", d, hp, true)
		}
	}
}

// recordSuite notes the TLS that a client negotiates with sys, once per
// system.
func (r *runner) recordSuite(ctx context.Context, sys, addr string) error {
	if _, ok := r.suites[sys]; ok {
		return nil
	}
	s, err := r.e.tlsSuite(ctx, addr)
	if err != nil {
		return err
	}
	r.suites[sys] = s
	params := map[string]any{"negotiated": s}
	if sys == "haproxy" {
		params["tune.bufsize"] = haproxyBufSize
		params["nbthread"] = runtime.NumCPU()
	}
	r.res.Points = append(r.res.Points, report.Point{Scenario: "tls", System: sys, Params: params, Metrics: map[string]float64{}})
	return nil
}

// checkSuites fails the run when the systems negotiated different TLS.
func (r *runner) checkSuites() error {
	seen := map[string][]string{}
	for sys, s := range r.suites {
		seen[s] = append(seen[s], sys)
	}
	if len(seen) <= 1 {
		return nil
	}
	var parts []string
	for s, systems := range seen {
		sort.Strings(systems)
		parts = append(parts, s+": "+strings.Join(systems, ", "))
	}
	sort.Strings(parts)
	return fmt.Errorf("bench: the systems negotiated different TLS, so their figures would compare ciphers: %s", strings.Join(parts, "; "))
}
