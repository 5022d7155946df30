package web

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The dashboard's charts: the console samples the roles' own Prometheus
// counters from the admin listener's /metrics and keeps the last ten
// minutes in memory.
const (
	chartEvery   = 10 * time.Second
	chartSamples = 60
)

// chartDef is one chart: a gauge shown as it is, or a counter shown as
// its rate per minute; only series whose labels match count.
type chartDef struct {
	title, family string
	rate          bool
	labels        map[string]string
}

// chartDefs are the dashboard's charts.
func chartDefs() []chartDef {
	return []chartDef{
		{title: "Tunnels open", family: "deskway_gateway_tunnels_active"},
		{title: "Launches per minute", family: "deskway_broker_launches_total", rate: true},
		{title: "Failed gateway logins per minute", family: "deskway_gateway_auth_total", rate: true, labels: map[string]string{"result": "failed"}},
		{title: "Machines booted from vDisks", family: "deskway_stream_boots"},
	}
}

// sampler keeps the samples of every chart.
type sampler struct {
	client *http.Client
	url    string

	mu   sync.Mutex
	at   []time.Time
	vals [][]float64 // per sample, per chart (NaN-free: absent is 0)
}

// fresh samples now unless the last sample is younger than d, so that a
// dashboard opened between samples shows the present.
func (sm *sampler) fresh(ctx context.Context, d time.Duration) {
	sm.mu.Lock()
	stale := len(sm.at) == 0 || time.Since(sm.at[len(sm.at)-1]) > d
	sm.mu.Unlock()
	if stale && sm.client != nil {
		sm.sample(ctx, sm.client, sm.url)
	}
}

// run samples url every chartEvery until ctx ends.
func (sm *sampler) run(ctx context.Context, client *http.Client, url string) {
	t := time.NewTicker(chartEvery)
	defer t.Stop()
	for {
		sm.sample(ctx, client, url)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (sm *sampler) sample(ctx context.Context, client *http.Client, url string) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, "GET", url, nil)
	resp, err := client.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return
	}
	defs := chartDefs()
	row := make([]float64, len(defs))
	for i, d := range defs {
		row[i] = sum(families[d.family], d.labels)
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.at = append(sm.at, time.Now())
	sm.vals = append(sm.vals, row)
	if len(sm.at) > chartSamples+1 {
		sm.at, sm.vals = sm.at[1:], sm.vals[1:]
	}
}

// sum adds the family's series whose labels include want.
func sum(f *dto.MetricFamily, want map[string]string) float64 {
	if f == nil {
		return 0
	}
	total := 0.0
	for _, m := range f.GetMetric() {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				found = found || l.GetName() == k && l.GetValue() == v
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

// chart is one sparkline on the dashboard.
type chart struct {
	Title string
	Now   string
	SVG   template.HTML
}

// charts draws every chart from the samples so far.
func (sm *sampler) charts() []chart {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	defs := chartDefs()
	out := make([]chart, 0, len(defs))
	for i, d := range defs {
		var ys []float64
		for j := range sm.vals {
			if !d.rate {
				ys = append(ys, sm.vals[j][i])
				continue
			}
			if j == 0 {
				continue
			}
			dt := sm.at[j].Sub(sm.at[j-1]).Minutes()
			dv := sm.vals[j][i] - sm.vals[j-1][i]
			if dt <= 0 || dv < 0 { // a restart resets counters
				dv = 0
			}
			if dt > 0 {
				ys = append(ys, dv/dt)
			}
		}
		c := chart{Title: d.title, Now: "–"}
		if len(ys) > 0 {
			c.Now = fmt.Sprintf("%.0f", ys[len(ys)-1])
		}
		c.SVG = sparkline(ys)
		out = append(out, c)
	}
	return out
}

// sparkline draws ys as an inline SVG line, 0 at the bottom.
func sparkline(ys []float64) template.HTML {
	const w, h = 240.0, 48.0
	top := 1.0
	for _, y := range ys {
		top = max(top, y)
	}
	var pts []string
	for i, y := range ys {
		x := w
		if len(ys) > 1 {
			x = float64(i) * w / float64(chartSamples-1)
		}
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, h-2-y/top*(h-4)))
	}
	// Numbers only: nothing from outside reaches the markup.
	return template.HTML(fmt.Sprintf(`<svg viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-hidden="true"><polyline fill="none" stroke="#0b57d0" stroke-width="2" points="%s"/></svg>`,
		w, h, w, h, strings.Join(pts, " ")))
}
