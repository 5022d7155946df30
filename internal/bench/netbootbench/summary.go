package netbootbench

import (
	"fmt"
	"slices"
	"strings"

	"github.com/deskway/deskway/internal/bench/report"
)

// short is each system's name in the summary's keys (BENCH.md's).
var short = map[string]string{"deskway-pxe": "pxe", "ltsp": "ltsp", "qemu-nbd-direct": "nbd"}

// summarize puts the headline figures in res.Summary: each system's
// boot (median of its runs, min and max beside it), and ratios taken
// run by run, each given for the median run and the worst.
func summarize(res *report.Result, one, crowd map[string][]float64) {
	s := res.Summary
	for sys, k := range short {
		v := one[sys]
		s[k+"_boot_s"], s[k+"_boot_s_min"], s[k+"_boot_s_max"] = report.Round(median(v), 2), report.Round(slices.Min(v), 2), report.Round(slices.Max(v), 2)
	}
	ratio := func(key string, num, den []float64) {
		var r []float64
		for i := range num {
			r = append(r, num[i]/den[i])
		}
		s[key], s[key+"_worst"] = report.Round(median(r), 2), report.Round(slices.Max(r), 2)
	}
	ratio("pxe_ratio_nbd", one["deskway-pxe"], one["qemu-nbd-direct"])
	ratio("pxe_ratio_ltsp", one["deskway-pxe"], one["ltsp"])
	ratio("ltsp_ratio_nbd", one["ltsp"], one["qemu-nbd-direct"])
	for key, c := range crowd {
		sys, n, _ := strings.Cut(key, "/")
		k := short[sys]
		ratio(fmt.Sprintf("%s%s_ratio_%s1", k, n, k), c, one[sys])
		s[fmt.Sprintf("%s%s_slowest_boot_s", k, n)] = report.Round(median(c), 2)
	}
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}
