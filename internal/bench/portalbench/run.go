package portalbench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// Run measures and writes the result when Out is set.
func Run(ctx context.Context, o Options) (*report.Result, error) {
	o.defaults()
	res := &report.Result{Bench: "portal", Command: o.Command, Started: time.Now().UTC(), Machine: report.ThisMachine(),
		Summary: map[string]float64{}}
	dir, err := os.MkdirTemp("", "deskway-portalbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	r, err := o.start(ctx, &wg, filepath.Join(dir, "storms"), 2*o.Runs*o.Users)
	if err != nil {
		return nil, err
	}
	defer r.st.Close()
	systems := map[string]func(context.Context, string) error{"deskway-api": r.apiLaunch, "deskway-portal": r.portalLaunch}
	var apiRates, portalRates, ratios []float64
	first := 0
	for run := 1; run <= o.Runs; run++ {
		order := []string{"deskway-api", "deskway-portal"}
		if run%2 == 0 {
			order[0], order[1] = order[1], order[0]
		}
		rates := map[string]float64{}
		for _, sys := range order {
			rate, lat, err := o.storm(ctx, systems[sys], first)
			if err != nil {
				return nil, fmt.Errorf("portalbench: run %d, %s: %w", run, sys, err)
			}
			first += o.Users
			rates[sys] = rate
			res.Points = append(res.Points, report.Point{Scenario: "launch", System: sys,
				Params:  map[string]any{"run": run, "users": o.Users, "concurrency": o.Concurrency},
				Metrics: map[string]float64{"launches_per_s": rate, "median_ms": report.Millis(lat[len(lat)/2]), "p99_ms": report.Millis(lat[len(lat)*99/100])}})
			o.Log.Info("launches", "system", sys, "run", run, "launches_per_s", report.Round(rate, 2), "median_ms", report.Round(report.Millis(lat[len(lat)/2]), 2))
		}
		apiRates = append(apiRates, rates["deskway-api"])
		portalRates = append(portalRates, rates["deskway-portal"])
		ratios = append(ratios, rates["deskway-portal"]/rates["deskway-api"])
	}
	res.Summary["api_launches_per_s"] = report.Round(median(apiRates), 2)
	res.Summary["portal_launches_per_s"] = report.Round(median(portalRates), 2)
	res.Summary["portal_ratio_api"] = report.Round(median(ratios), 2)
	res.Summary["portal_ratio_api_worst"] = report.Round(minOf(ratios), 2)

	// The console, on a broker whose database holds o.Sessions live
	// sessions, launched through its API.
	r, err = o.start(ctx, &wg, filepath.Join(dir, "console"), o.Sessions)
	if err != nil {
		return nil, err
	}
	defer r.st.Close()
	seed := o
	seed.Users = o.Sessions
	if _, _, err := seed.storm(ctx, r.apiLaunch, 0); err != nil {
		return nil, fmt.Errorf("portalbench: filling the console's broker: %w", err)
	}
	c, err := r.consoleClient(ctx)
	if err != nil {
		return nil, err
	}
	total := o.Sessions
	worst := 0.0
	for _, pg := range []struct{ name, path string }{
		{"dashboard", "/admin/"},
		{"sessions, first page", "/admin/sessions"},
		{"sessions, page 100", "/admin/sessions?page=100"},
		{"sessions of one user", "/admin/sessions?user=user00042"},
		{"hosts", "/admin/hosts"},
	} {
		lat := make([]time.Duration, o.ConsoleRequests)
		for i := range lat {
			t0 := time.Now()
			resp, err := c.Get(r.portal + pg.path)
			if err != nil {
				return nil, err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || strings.Contains(string(body), `class="error"`) {
				return nil, fmt.Errorf("portalbench: console %s: %s", pg.path, resp.Status)
			}
			lat[i] = time.Since(t0)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		p99 := report.Millis(lat[len(lat)*99/100])
		worst = max(worst, p99)
		res.Points = append(res.Points, report.Point{Scenario: "console", System: "deskway",
			Params:  map[string]any{"page": pg.name, "sessions": total, "requests": o.ConsoleRequests},
			Metrics: map[string]float64{"median_ms": report.Millis(lat[len(lat)/2]), "p99_ms": p99, "max_ms": report.Millis(lat[len(lat)-1])}})
		o.Log.Info("console", "page", pg.name, "median_ms", report.Round(report.Millis(lat[len(lat)/2]), 2), "p99_ms", report.Round(p99, 2))
	}
	res.Summary["console_p99_ms_10k_sessions"] = report.Round(worst, 2)
	res.Notes = []string{
		fmt.Sprintf("One broker (SQLite, the embedded default), its admin API and the portal with its console run in this process, each over TLS on loopback, with %d session hosts registered through the agent API; as in deskway up, the portal calls the broker of its own process directly (its launch, desktops and logoff code, with no socket, HTTP or JSON between them). Each run launches %d new users through the broker's API (HTTP Basic, one request) and %d more through the portal (sign in, its redirect to the desktops page, then Launch: three requests, and two calls from the portal to the broker), %d at a time; the two take turns to go first. Every answer is checked to be an .rdp file with a gateway token. Both load generators run in this process on the same cores, kept lean alike: one pool of keep-alive connections, no cookie jar, a deadline per launch.", o.Hosts, o.Users, o.Users, o.Concurrency),
		fmt.Sprintf("%d runs of each. Headlines are the median run; portal_ratio_api is the median of the per-run ratios, with the worst beside it.", o.Runs),
		fmt.Sprintf("The console is then timed on a second broker with a fresh database, filled with %d live sessions launched through its API: %d sequential requests per page by a signed-in administrator; each page is one or two admin API calls (the sessions list pages and filters in the database: count and LIMIT/OFFSET). console_p99_ms_10k_sessions is the worst page's p99.", total, o.ConsoleRequests),
	}
	if o.Out != "" {
		if err := write(res, o.Out); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// consoleClient signs the bench's administrator in to the console.
func (r *rig) consoleClient(ctx context.Context) (*http.Client, error) {
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Transport: r.client.Transport, Timeout: time.Minute}
	req, _ := http.NewRequestWithContext(ctx, "POST", r.portal+"/signin", strings.NewReader(url.Values{"user": {"ops"}, "password": {password}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	return c, nil
}

func write(res *report.Result, dir string) error {
	if err := res.WriteJSON(dir); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Portal and console\n\n`%s`\n\nMeasured %s on %d CPUs, %.0f GiB, Linux %s, %s.\n\nSummary: %v\n\n",
		res.Command, res.Started.Format(time.RFC3339), res.Machine.CPUs, float64(res.Machine.MemBytes)/(1<<30), res.Machine.Kernel, res.Machine.Go, res.Summary)
	t := report.Table{Title: "Launches per second, the same broker, taking turns", Head: []string{"Run", "Bare API", "Portal", "Portal ÷ API", "API median (ms)", "Portal median (ms)"}}
	var runs []int
	by := map[int]map[string]map[string]float64{}
	for _, p := range res.Points {
		if p.Scenario != "launch" {
			continue
		}
		run := toInt(p.Params["run"])
		if by[run] == nil {
			by[run] = map[string]map[string]float64{}
			runs = append(runs, run)
		}
		by[run][p.System] = p.Metrics
	}
	sort.Ints(runs)
	var api, portal report.Series
	api.Name, portal.Name = "bare API", "portal"
	labels := []string{}
	for _, run := range runs {
		a, p := by[run]["deskway-api"], by[run]["deskway-portal"]
		t.Rows = append(t.Rows, []string{fmt.Sprint(run), fmt.Sprintf("%.0f", a["launches_per_s"]), fmt.Sprintf("%.0f", p["launches_per_s"]),
			fmt.Sprintf("%.2f", p["launches_per_s"]/a["launches_per_s"]), fmt.Sprintf("%.1f", a["median_ms"]), fmt.Sprintf("%.1f", p["median_ms"])})
		labels = append(labels, fmt.Sprintf("run %d", run))
		api.Y = append(api.Y, a["launches_per_s"])
		portal.Y = append(portal.Y, p["launches_per_s"])
	}
	b.WriteString(t.Markdown())
	ct := report.Table{Title: "Console pages", Head: []string{"Page", "Sessions in the store", "Median (ms)", "p99 (ms)", "Max (ms)"}}
	for _, p := range res.Points {
		if p.Scenario == "console" {
			ct.Rows = append(ct.Rows, []string{fmt.Sprint(p.Params["page"]), fmt.Sprint(p.Params["sessions"]),
				fmt.Sprintf("%.1f", p.Metrics["median_ms"]), fmt.Sprintf("%.1f", p.Metrics["p99_ms"]), fmt.Sprintf("%.1f", p.Metrics["max_ms"])})
		}
	}
	b.WriteString(ct.Markdown())
	b.WriteString("\n## How it was measured\n\n")
	for _, n := range res.Notes {
		b.WriteString("- " + n + "\n")
	}
	b.WriteString("\nChart: `launches.svg`.\n")
	if err := os.WriteFile(filepath.Join(dir, "result.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return report.BarChart(filepath.Join(dir, "launches.svg"), "Launches per second, bare API and portal", "launches/s", labels, []report.Series{api, portal})
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func minOf(v []float64) float64 {
	m := v[0]
	for _, x := range v[1:] {
		m = min(m, x)
	}
	return m
}

func toInt(v any) int {
	switch x := v.(type) {
	case int:
		return x
	case float64:
		return int(x)
	}
	return 0
}
