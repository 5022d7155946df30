package bootstorm

import (
	"testing"

	"github.com/deskway/deskway/internal/bench/report"
)

// TestMedianPointTakesEachFiguresOwnMedian: three storm runs tie at no
// slow request; the boot time compared must be the median boot (20.3 s),
// not whichever run the tie left in the middle (19.29 s, the fastest).
func TestMedianPointTakesEachFiguresOwnMedian(t *testing.T) {
	run := func(slow, boot float64) report.Point {
		return report.Point{Params: map[string]any{}, Metrics: map[string]float64{"slow_requests": slow, "boot_median_s": boot}}
	}
	p := medianPoint([]report.Point{run(0, 20.3), run(0, 19.29), run(0, 21.0)}, "slow_requests")
	if p.Metrics["boot_median_s"] != 20.3 || p.Metrics["boot_median_s_min"] != 19.29 || p.Metrics["boot_median_s_max"] != 21.0 {
		t.Errorf("boot %v (min %v, max %v), want the median 20.3 (19.29, 21)", p.Metrics["boot_median_s"], p.Metrics["boot_median_s_min"], p.Metrics["boot_median_s_max"])
	}
	if p.Metrics["slow_requests"] != 0 || p.Metrics["slow_requests_max"] != 0 {
		t.Errorf("slow requests %v", p.Metrics)
	}
	p = medianPoint([]report.Point{run(5, 20), run(240, 22), run(4833, 21)}, "slow_requests")
	if p.Metrics["slow_requests"] != 240 || p.Metrics["slow_requests_max"] != 4833 || p.Metrics["boot_median_s"] != 21 {
		t.Errorf("median run %v", p.Metrics)
	}
}
