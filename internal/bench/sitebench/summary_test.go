package sitebench

import "testing"

// TestSummarize: ratios are taken within each run and summarized as the
// median and the lowest run, never the best; a figure some run lacks is
// left out rather than summarized from the runs that have it.
func TestSummarize(t *testing.T) {
	run := func(gre1, wggo1, gre8, wggo8, vx8, cores float64) map[string]sample {
		return map[string]sample{
			key(sysGRE, 1): {gbps: gre1, machineCores: cores}, key(sysWGGo, 1): {gbps: wggo1},
			key(sysGRE, 8): {gbps: gre8, machineCores: cores, gatewayCores: 0.5}, key(sysWGGo, 8): {gbps: wggo8},
			key(sysVXLAN, 8): {gbps: vx8},
		}
	}
	// Run 2 is GRE's best run in Gbit/s but its worst ratio: the ratio
	// must come from within each run, not from the medians' quotient.
	runs := []map[string]sample{run(1, 1, 2, 1, 4, 2), run(3, 6, 4, 4, 8, 2), run(2, 1, 3, 2, 4, 2)}
	sum := map[string]float64{}
	summarize(sum, runs)
	for k, want := range map[string]float64{
		"gre_single_ratio_wggo": 1, "gre_single_ratio_wggo_worst": 0.5,
		"gre_multi_ratio_wggo": 1.5, "gre_multi_ratio_wggo_worst": 1,
		"gre_multi_ratio_vxlan": 0.5, "gre_multi_ratio_vxlan_worst": 0.5,
		"gre_single_gbps": 2, "gre_single_gbps_worst": 1,
		"gre_gbps_per_core": 1.5, "gre_gbps_per_core_worst": 1,
		"gre_gbps_per_gateway_core": 6, "gre_gbps_per_gateway_core_worst": 4,
	} {
		if got, ok := sum[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	// WireGuard mode and the direct path never ran.
	for _, k := range []string{"wg_single_ratio_wggo", "gre_multi_ratio_direct"} {
		if _, ok := sum[k]; ok {
			t.Errorf("%s summarized from no measurement", k)
		}
	}
	// wireguard-go missing from one run: no ratio to it at all.
	delete(runs[1], key(sysWGGo, 1))
	sum = map[string]float64{}
	summarize(sum, runs)
	if v, ok := sum["gre_single_ratio_wggo"]; ok {
		t.Errorf("gre_single_ratio_wggo = %v from two of three runs", v)
	}
}

// TestSummarizeKernel: the kernel datapath's row gets its own ratios
// and per-core figures beside the userspace GRE's, from its own samples.
func TestSummarizeKernel(t *testing.T) {
	runs := []map[string]sample{
		{key(sysKernel, 8): {gbps: 6, machineCores: 2}, key(sysGRE, 8): {gbps: 1, machineCores: 2}, key(sysWGGo, 8): {gbps: 2}, key(sysVXLAN, 8): {gbps: 8}},
	}
	sum := map[string]float64{}
	summarize(sum, runs)
	for k, want := range map[string]float64{
		"grek_multi_ratio_wggo": 3, "grek_multi_ratio_vxlan": 0.75, "grek_gbps_per_core": 3, "grek_multi_gbps": 6,
		"gre_multi_ratio_wggo": 0.5,
	} {
		if got, ok := sum[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	// The kernel forwards in softirq: no gateway process's core to count.
	if v, ok := sum["grek_gbps_per_gateway_core"]; ok {
		t.Errorf("grek_gbps_per_gateway_core = %v for a gateway whose process does not forward", v)
	}
}
