package browserbench

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/config"
)

// cpuPerMiB is the gateway's CPU milliseconds per MiB it relayed.
func cpuPerMiB(s sample, window time.Duration) float64 {
	if s.bytes == 0 {
		return 0
	}
	return s.cpuPct / 100 * window.Seconds() * 1000 / (float64(s.bytes) / (1 << 20))
}

// sysName names a client in the result: xfreerdp, or the browser with the
// gateway's browser_compression setting (the default's unnamed).
func sysName(s string) string {
	switch s {
	case "xfreerdp":
		return "deskway-xfreerdp"
	case config.BrowserCompressionContext:
		return "deskway-browser"
	case config.BrowserCompressionOff:
		return "deskway-browser-uncompressed"
	}
	return "deskway-browser-" + strings.ReplaceAll(s, "_", "-")
}

// keySuffix is what a browser setting's summary keys end in: nothing for
// the default's.
func keySuffix(mode string) string {
	if mode == config.BrowserCompressionContext {
		return ""
	}
	return "_" + mode
}

// summarize sets the summary: for each browser setting, the browser
// against xfreerdp of the same runs.
func summarize(res *report.Result, runs map[string][]sample, modes []string) {
	xf := runs["xfreerdp"]
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
	s := res.Summary
	s["xfreerdp_first_frame_s"] = report.Round(median(get(xf, first)), 3)
	s["xfreerdp_fps"] = report.Round(median(get(xf, fps)), 3)
	s["xfreerdp_gateway_cpu_pct"] = report.Round(median(get(xf, cpu)), 3)
	for _, m := range modes {
		br, k := runs[m], keySuffix(m)
		var ffRatio, cpuRatio, perMiBRatio, bytesRatio []float64
		for i := range br {
			ffRatio = append(ffRatio, first(br[i])/first(xf[i]))
			if cpu(xf[i]) > 0 {
				cpuRatio = append(cpuRatio, cpu(br[i])/cpu(xf[i]))
			}
			if xf[i].bytes > 0 && br[i].bytes > 0 {
				perMiBRatio = append(perMiBRatio, (cpu(br[i])/float64(br[i].bytes))/(cpu(xf[i])/float64(xf[i].bytes)))
			}
			if xf[i].toClient > 0 {
				bytesRatio = append(bytesRatio, float64(br[i].toClient)/float64(xf[i].toClient))
			}
		}
		s["browser_first_frame_s"+k] = report.Round(median(get(br, first)), 3)
		s["first_frame_ratio"+k] = report.Round(median(ffRatio), 3)
		s["first_frame_ratio"+k+"_worst"] = report.Round(maxOf(ffRatio), 3)
		s["browser_fps"+k] = report.Round(median(get(br, fps)), 3)
		s["browser_gateway_cpu_pct"+k] = report.Round(median(get(br, cpu)), 3)
		s["browser_page_ready_s"+k] = report.Round(median(get(br, func(s sample) float64 { return s.pageReady.Seconds() })), 3)
		if len(bytesRatio) > 0 {
			s["bytes_ratio_tsgu"+k] = report.Round(median(bytesRatio), 3)
			s["bytes_ratio_tsgu"+k+"_worst"] = report.Round(maxOf(bytesRatio), 3)
		}
		if len(perMiBRatio) > 0 {
			s["gateway_cpu_per_byte_ratio_tsgu"+k] = report.Round(median(perMiBRatio), 3)
		}
		if len(cpuRatio) > 0 {
			s["gateway_cpu_ratio_tsgu"+k] = report.Round(median(cpuRatio), 3)
			s["gateway_cpu_ratio_tsgu"+k+"_worst"] = report.Round(maxOf(cpuRatio), 3)
		}
	}
}

func write(res *report.Result, dir string, modes []string) error {
	if err := res.WriteJSON(dir); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Browser desktops\n\n`%s`\n\nMeasured %s on %d CPUs, %.0f GiB, Linux %s, %s.\n\n", res.Command, res.Started.Format(time.RFC3339),
		res.Machine.CPUs, float64(res.Machine.MemBytes)/(1<<30), res.Machine.Kernel, res.Machine.Go)
	t := report.Table{Title: "Each run, the clients taking turns on one session", Head: []string{"Run", "Client", "Click to first frame (s)", "Frames/s, window moving",
		"Gateway CPU (%)", "Through the gateway (KiB/s)", "To the client (KiB/s)", "Gateway CPU (ms/MiB)"}}
	ff := map[string][]float64{}
	var labels []string
	for _, p := range res.Points {
		run := fmt.Sprint(p.Params["run"])
		t.Rows = append(t.Rows, []string{run, p.System, fmt.Sprintf("%.2f", p.Metrics["first_frame_s"]), fmt.Sprintf("%.1f", p.Metrics["fps"]),
			fmt.Sprintf("%.2f", p.Metrics["gateway_cpu_pct"]), fmt.Sprintf("%.0f", p.Metrics["gateway_kbytes_per_s"]), fmt.Sprintf("%.0f", p.Metrics["to_client_kbytes_per_s"]),
			fmt.Sprintf("%.1f", p.Metrics["gateway_cpu_ms_per_mib"])})
		ff[p.System] = append(ff[p.System], p.Metrics["first_frame_s"])
		if p.System == "deskway-xfreerdp" {
			labels = append(labels, "run "+run)
		}
	}
	s := res.Summary
	b.WriteString("Summary (medians over runs, the worst run beside each ratio), each browser setting against xfreerdp in the same runs:\n\n")
	bt := report.Table{Head: []string{"Browser (gateway.browser_compression)", "Bytes to the client ÷ xfreerdp's", "Gateway CPU ÷ the MS-TSGU tunnel's", "per byte relayed",
		"Click to first frame (s)", "÷ xfreerdp's", "Frames/s"}}
	for _, m := range modes {
		k := keySuffix(m)
		bt.Rows = append(bt.Rows, []string{fmt.Sprintf("%s (%s)", sysName(m), m),
			fmt.Sprintf("**%.2f ×** (worst %.2f ×)", s["bytes_ratio_tsgu"+k], s["bytes_ratio_tsgu"+k+"_worst"]),
			fmt.Sprintf("**%.2f ×** (worst %.2f ×)", s["gateway_cpu_ratio_tsgu"+k], s["gateway_cpu_ratio_tsgu"+k+"_worst"]),
			fmt.Sprintf("%.2f ×", s["gateway_cpu_per_byte_ratio_tsgu"+k]),
			fmt.Sprintf("%.2f (page %.2f before)", s["browser_first_frame_s"+k], s["browser_page_ready_s"+k]),
			fmt.Sprintf("%.2f × (worst %.2f ×)", s["first_frame_ratio"+k], s["first_frame_ratio"+k+"_worst"]),
			fmt.Sprintf("%.1f", s["browser_fps"+k])})
	}
	b.WriteString(bt.Markdown())
	fmt.Fprintf(&b, "\nxfreerdp: first frame %.2f s from its start, %.1f frames/s, gateway CPU %.2f %%.\n\n", s["xfreerdp_first_frame_s"], s["xfreerdp_fps"], s["xfreerdp_gateway_cpu_pct"])
	b.WriteString(t.Markdown())
	b.WriteString("\n## How it was measured\n\n")
	for _, n := range res.Notes {
		b.WriteString("- " + n + "\n")
	}
	shots := []string{"`xfreerdp-moving.png`"}
	series := []report.Series{{Name: "xfreerdp", Y: ff["deskway-xfreerdp"]}}
	for _, m := range modes {
		n := sysName(m)
		shots = append(shots, "`"+strings.TrimPrefix(n, "deskway-")+"-moving.png`")
		series = append(series, report.Series{Name: strings.TrimPrefix(n, "deskway-"), Y: ff[n]})
	}
	fmt.Fprintf(&b, "\nChart: `first-frame.svg`. What each client showed at the end of the last run's moving window: %s.\n", strings.Join(shots, ", "))
	if err := os.WriteFile(filepath.Join(dir, "result.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return report.BarChart(filepath.Join(dir, "first-frame.svg"), "Click to first frame", "seconds", labels, series)
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
