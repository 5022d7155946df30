package browserbench

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// cpuPerMiB is the gateway's CPU milliseconds per MiB it relayed.
func cpuPerMiB(s sample, window time.Duration) float64 {
	if s.bytes == 0 {
		return 0
	}
	return s.cpuPct / 100 * window.Seconds() * 1000 / (float64(s.bytes) / (1 << 20))
}

func sysName(s string) string {
	if s == "browser" {
		return "deskway-browser"
	}
	return "deskway-xfreerdp"
}

func summarize(res *report.Result, runs map[string][]sample) {
	br, xf := runs["browser"], runs["xfreerdp"]
	get := func(ss []sample, f func(sample) float64) []float64 {
		var out []float64
		for _, s := range ss {
			out = append(out, f(s))
		}
		return out
	}
	first := func(s sample) float64 { return s.firstFrame.Seconds() }
	cpu := func(s sample) float64 { return s.cpuPct }
	fps := func(s sample) float64 { return s.fps }
	var ffRatio, cpuRatio, perMiBRatio []float64
	for i := range br {
		ffRatio = append(ffRatio, first(br[i])/first(xf[i]))
		if cpu(xf[i]) > 0 {
			cpuRatio = append(cpuRatio, cpu(br[i])/cpu(xf[i]))
		}
		if xf[i].bytes > 0 && br[i].bytes > 0 {
			perMiBRatio = append(perMiBRatio, (cpu(br[i])/float64(br[i].bytes))/(cpu(xf[i])/float64(xf[i].bytes)))
		}
	}
	s := res.Summary
	s["browser_first_frame_s"] = round3(median(get(br, first)))
	s["xfreerdp_first_frame_s"] = round3(median(get(xf, first)))
	s["first_frame_ratio"] = round3(median(ffRatio))
	s["first_frame_ratio_worst"] = round3(maxOf(ffRatio))
	s["browser_fps"] = round3(median(get(br, fps)))
	s["xfreerdp_fps"] = round3(median(get(xf, fps)))
	s["browser_gateway_cpu_pct"] = round3(median(get(br, cpu)))
	s["xfreerdp_gateway_cpu_pct"] = round3(median(get(xf, cpu)))
	s["browser_page_ready_s"] = round3(median(get(br, func(s sample) float64 { return s.pageReady.Seconds() })))
	bytesPerS := func(s sample) float64 { return float64(s.bytes) }
	if xb := median(get(xf, bytesPerS)); xb > 0 {
		s["bytes_ratio_tsgu"] = round3(median(get(br, bytesPerS)) / xb)
	}
	if len(perMiBRatio) > 0 {
		s["gateway_cpu_per_byte_ratio_tsgu"] = round3(median(perMiBRatio))
	}
	if len(cpuRatio) > 0 {
		s["gateway_cpu_ratio_tsgu"] = round3(median(cpuRatio))
		s["gateway_cpu_ratio_tsgu_worst"] = round3(maxOf(cpuRatio))
	}
}

func write(res *report.Result, dir string) error {
	if err := res.WriteJSON(dir); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Browser desktops\n\n`%s`\n\nMeasured %s on %d CPUs, %.0f GiB, Linux %s, %s.\n\n", res.Command, res.Started.Format(time.RFC3339),
		res.Machine.CPUs, float64(res.Machine.MemBytes)/(1<<30), res.Machine.Kernel, res.Machine.Go)
	t := report.Table{Title: "Each run, the two clients taking turns on one session", Head: []string{"Run", "Client", "Click to first frame (s)", "Frames/s, window moving", "Gateway CPU (%)", "Through the gateway (KiB/s)", "Gateway CPU (ms/MiB)"}}
	ff := map[string][]float64{}
	var labels []string
	for _, p := range res.Points {
		run := fmt.Sprint(p.Params["run"])
		t.Rows = append(t.Rows, []string{run, p.System, fmt.Sprintf("%.2f", p.Metrics["first_frame_s"]), fmt.Sprintf("%.1f", p.Metrics["fps"]),
			fmt.Sprintf("%.2f", p.Metrics["gateway_cpu_pct"]), fmt.Sprintf("%.0f", p.Metrics["gateway_kbytes_per_s"]), fmt.Sprintf("%.1f", p.Metrics["gateway_cpu_ms_per_mib"])})
		ff[p.System] = append(ff[p.System], p.Metrics["first_frame_s"])
		if p.System == "deskway-browser" {
			labels = append(labels, "run "+run)
		}
	}
	s := res.Summary
	fmt.Fprintf(&b, "Summary (medians over runs): click on Connect to first frame %.2f s in the browser (its page and client loaded in %.2f s before that), %.2f s with xfreerdp from its start: **%.2f ×** (worst run %.2f ×); frames shown while a window moves %.1f/s and %.1f/s; gateway CPU for the browser session **%.2f ×** that of the MS-TSGU tunnel (worst run %.2f ×), for %.2f × the bytes, so %.2f × per byte.\n\n",
		s["browser_first_frame_s"], s["browser_page_ready_s"], s["xfreerdp_first_frame_s"], s["first_frame_ratio"], s["first_frame_ratio_worst"], s["browser_fps"], s["xfreerdp_fps"],
		s["gateway_cpu_ratio_tsgu"], s["gateway_cpu_ratio_tsgu_worst"], s["bytes_ratio_tsgu"], s["gateway_cpu_per_byte_ratio_tsgu"])
	b.WriteString(t.Markdown())
	b.WriteString("\n## How it was measured\n\n")
	for _, n := range res.Notes {
		b.WriteString("- " + n + "\n")
	}
	b.WriteString("\nChart: `first-frame.svg`. What each client showed at the end of the last run's moving window: `browser-moving.png`, `xfreerdp-moving.png`.\n")
	if err := os.WriteFile(filepath.Join(dir, "result.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return report.BarChart(filepath.Join(dir, "first-frame.svg"), "Click to first frame", "seconds", labels,
		[]report.Series{{Name: "browser", Y: ff["deskway-browser"]}, {Name: "xfreerdp", Y: ff["deskway-xfreerdp"]}})
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }
