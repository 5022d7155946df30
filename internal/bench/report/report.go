// Package report writes bench results in the shape every deskway bench
// shares: result.json (machine-readable), result.md (the paper's tables,
// deskway beside its peers) and SVG charts.
package report

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Machine describes where a result was measured.
type Machine struct {
	CPUs     int    `json:"cpus"`
	MemBytes int64  `json:"mem_bytes"`
	Kernel   string `json:"kernel"`
	Go       string `json:"go"`
}

// Point is one measurement of one system.
type Point struct {
	Scenario string             `json:"scenario"`
	System   string             `json:"system"`
	Params   map[string]any     `json:"params"`
	Metrics  map[string]float64 `json:"metrics"`
	Skipped  string             `json:"skipped,omitempty"`
}

// Result is result.json.
type Result struct {
	Bench   string             `json:"bench"`
	Command string             `json:"command"`
	Started time.Time          `json:"started"`
	Machine Machine            `json:"machine"`
	Points  []Point            `json:"points"`
	Summary map[string]float64 `json:"-"`
	// SummaryText holds the headline figures that are names, not
	// numbers (what limited a result); result.json keeps them in
	// "summary" beside the numbers.
	SummaryText map[string]string `json:"-"`
	// Notes say what limited a result and how it was measured.
	Notes []string `json:"notes,omitempty"`
}

// resultJSON is Result with the two summaries as one object.
type resultJSON struct {
	resultFields
	Summary map[string]any `json:"summary"`
}

// resultFields is Result without its methods, so that marshaling it
// does not recurse.
type resultFields Result

// MarshalJSON writes Summary and SummaryText as one "summary" object.
func (r Result) MarshalJSON() ([]byte, error) {
	sum := map[string]any{}
	for k, v := range r.Summary {
		sum[k] = v
	}
	for k, v := range r.SummaryText {
		sum[k] = v
	}
	return json.Marshal(resultJSON{resultFields: resultFields(r), Summary: sum})
}

// UnmarshalJSON reads "summary" into Summary (numbers) and SummaryText
// (strings).
func (r *Result) UnmarshalJSON(b []byte) error {
	var in resultJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*r = Result(in.resultFields)
	r.Summary, r.SummaryText = map[string]float64{}, map[string]string{}
	for k, v := range in.Summary {
		switch x := v.(type) {
		case float64:
			r.Summary[k] = x
		case string:
			r.SummaryText[k] = x
		default:
			return fmt.Errorf("report: summary %s is neither a number nor a name: %v", k, v)
		}
	}
	return nil
}

// ThisMachine reads the machine's description.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
		m.MemBytes = kb << 10
	}
	return m
}

// LoadAverage is the machine's 1, 5 and 15 minute load averages as
// /proc/loadavg has them ("0.52 0.58 0.59"), or "unknown": a bench run
// on a busy machine says so beside its figures.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// WriteJSON writes result.json into dir.
func (r *Result) WriteJSON(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "result.json"), append(b, '\n'), 0o644)
}

// Table is a markdown table.
type Table struct {
	Title string
	Head  []string
	Rows  [][]string
}

// Markdown renders t.
func (t Table) Markdown() string {
	var b strings.Builder
	if t.Title != "" {
		fmt.Fprintf(&b, "**%s**\n\n", t.Title)
	}
	b.WriteString("| " + strings.Join(t.Head, " | ") + " |\n|")
	for range t.Head {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	return b.String() + "\n"
}

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#7f7f7f", "#9467bd", "#ff7f0e"}

// LineChart writes an SVG line chart with a legend.
func LineChart(path, title, xLabel, yLabel string, series []Series, hline float64) error {
	const w, h, ml, mr, mt, mb = 720.0, 420.0, 70.0, 160.0, 40.0, 50.0
	xmax, ymax := 0.0, hline
	for _, s := range series {
		for i := range s.X {
			xmax = math.Max(xmax, s.X[i])
			ymax = math.Max(ymax, s.Y[i])
		}
	}
	if xmax == 0 {
		xmax = 1
	}
	if ymax == 0 {
		ymax = 1
	}
	ymax = niceCeil(ymax)
	xmax = niceCeil(xmax)
	px := func(x float64) float64 { return ml + x/xmax*(w-ml-mr) }
	py := func(y float64) float64 { return h - mb - y/ymax*(h-mt-mb) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`, w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%.0f" y="22" font-size="15">%s</text>`, ml, html.EscapeString(title))
	for i := 0; i <= 5; i++ {
		yv := ymax * float64(i) / 5
		xv := xmax * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`, ml, w-mr, py(yv), py(yv))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`, ml-6, py(yv)+4, fmtNum(yv))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, px(xv), h-mb+18, fmtNum(xv))
	}
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="black"/><line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="black"/>`,
		ml, w-mr, h-mb, h-mb, ml, ml, mt, h-mb)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`, (ml+w-mr)/2, h-10, html.EscapeString(xLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.0f) rotate(-90)" text-anchor="middle">%s</text>`, (mt+h-mb)/2, html.EscapeString(yLabel))
	if hline > 0 {
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="4 4"/>`, ml, w-mr, py(hline), py(hline))
	}
	for i, s := range series {
		c := palette[i%len(palette)]
		var pts []string
		for j := range s.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.X[j]), py(math.Min(s.Y[j], ymax))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, c, strings.Join(pts, " "))
		for _, p := range pts {
			xy := strings.Split(p, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, xy[0], xy[1], c)
		}
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`,
			w-mr+12, mt+float64(i)*20, c, w-mr+30, mt+float64(i)*20+11, html.EscapeString(s.Name))
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// BarChart writes grouped bars: one group per label, one bar per series.
func BarChart(path, title, yLabel string, labels []string, series []Series) error {
	const w, h, ml, mr, mt, mb = 720.0, 400.0, 70.0, 160.0, 40.0, 50.0
	ymax := 0.0
	for _, s := range series {
		for _, y := range s.Y {
			ymax = math.Max(ymax, y)
		}
	}
	if ymax == 0 {
		ymax = 1
	}
	ymax = niceCeil(ymax)
	py := func(y float64) float64 { return h - mb - y/ymax*(h-mt-mb) }
	gw := (w - ml - mr) / float64(len(labels))
	bw := gw * 0.8 / float64(len(series))
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`, w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%.0f" y="22" font-size="15">%s</text>`, ml, html.EscapeString(title))
	for i := 0; i <= 5; i++ {
		yv := ymax * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`,
			ml, w-mr, py(yv), py(yv), ml-6, py(yv)+4, fmtNum(yv))
	}
	fmt.Fprintf(&b, `<text transform="translate(16 %.0f) rotate(-90)" text-anchor="middle">%s</text>`, (mt+h-mb)/2, html.EscapeString(yLabel))
	for gi, l := range labels {
		x0 := ml + float64(gi)*gw + gw*0.1
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`, ml+float64(gi)*gw+gw/2, h-mb+18, html.EscapeString(l))
		for si, s := range series {
			if gi >= len(s.Y) {
				continue
			}
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x0+float64(si)*bw, py(s.Y[gi]), bw-2, h-mb-py(s.Y[gi]), palette[si%len(palette)])
		}
	}
	for si, s := range series {
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`,
			w-mr+12, mt+float64(si)*20, palette[si%len(palette)], w-mr+30, mt+float64(si)*20+11, html.EscapeString(s.Name))
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func fmtNum(v float64) string {
	if v >= 100 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

// SortPoints orders points by scenario, system and then tunnel count.
func SortPoints(ps []Point) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].Scenario != ps[j].Scenario {
			return ps[i].Scenario < ps[j].Scenario
		}
		return ps[i].System < ps[j].System
	})
}
