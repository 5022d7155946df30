package netbootbench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/bench/report"
)

// TestSummaryNamesItsRuns checks that the summary's ratios are taken run
// by run, the median run's and the worst's, never the best's, and that
// result.md gives each target a verdict of the worst run too.
func TestSummaryNamesItsRuns(t *testing.T) {
	res := &report.Result{Bench: "netboot", Summary: map[string]float64{}, SummaryText: map[string]string{"accel": "tcg", "accel_why": "test"}}
	one := map[string][]float64{"deskway-pxe": {6, 7, 9}, "ltsp": {7, 7, 8}, "qemu-nbd-direct": {5, 6, 6}}
	crowd := map[string][]float64{"deskway-pxe/4": {12, 14, 18}, "ltsp/4": {14, 14, 16}, "qemu-nbd-direct/4": {10, 12, 12}, "deskway-pxe/8": {24, 28, 36}}
	summarize(res, one, crowd)
	s := res.Summary
	for k, want := range map[string]float64{
		"pxe_boot_s": 7, "pxe_boot_s_max": 9, "ltsp_boot_s": 7, "nbd_boot_s": 6,
		"pxe_ratio_ltsp": 1, "pxe_ratio_ltsp_worst": 1.13, // 6/7, 7/7, 9/8
		"pxe_ratio_nbd": 1.2, "pxe_ratio_nbd_worst": 1.5, // 6/5, 7/6, 9/6
		"pxe4_ratio_pxe1": 2, "pxe8_ratio_pxe1_worst": 4, "ltsp4_ratio_ltsp1": 2, "nbd4_ratio_nbd1_worst": 2,
	} {
		if s[k] != want {
			t.Errorf("%s = %v, want %v", k, s[k], want)
		}
	}
	if _, ok := s["ltsp8_ratio_ltsp1"]; ok {
		t.Error("a ratio for a crowd that did not boot")
	}
	dir := t.TempDir()
	if err := write(res, dir, 3, []int{4}, []int{8}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "result.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| deskway ≤ 1.0 × the LTSP stack | 1.00 × | 1.13 × | not met |", "not met: measured on tcg", "| 8 | deskway-pxe | 28.00 s | 4.00 × | 4.00 × |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("result.md lacks %q:\n%s", want, md)
		}
	}
}
