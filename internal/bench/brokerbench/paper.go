package brokerbench

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// paperRow is one column of the paper's tables (XenApp/XenDesktop 7.7,
// 57 VDAs, 10,000 launches); a negative value is a cell the paper left
// empty (N/A).
type paperRow struct {
	rtt, c           int
	avgS, perS, errs float64
	launchS          float64
}

// paperRows are the published figures, typed in from the paper.
var paperRows = []paperRow{
	{10, 12, 0.9, 14, 0, 11*60 + 57}, {10, 24, 1.4, 17.8, 0, 9*60 + 24}, {10, 36, 1.6, 22.9, 0, 7*60 + 16},
	{10, 48, 2.1, 23.2, 0, 7*60 + 11}, {10, 60, 2.6, 22.9, 0, 7*60 + 17},
	{45, 12, 1.7, 7.1, 0, 23*60 + 28}, {45, 24, 3.1, 7.8, 0, 21*60 + 19}, {45, 36, 4.3, 8.4, 0, 19*60 + 51},
	{45, 48, 6.4, 7.5, 0.01, 22*60 + 15}, {45, 60, 7.3, 8.2, 0.01, 20*60 + 19},
	{90, 12, 2.9, 4.1, 0, 40*60 + 30}, {90, 24, 6.4, 3.7, 0, 44*60 + 29}, {90, 36, 9.5, 3.8, 0, 44*60 + 11},
	{90, 48, 12.9, 3.7, 0.01, 44*60 + 55}, {90, 60, 16.2, 3.7, 0.01, 45*60 + 4},
	{160, 12, 5.7, 2.1, 0, 79 * 60}, {160, 24, 11.4, 2.1, 0, 79*60 + 27}, {160, 36, 17.3, 2.1, 0.12, 79*60 + 55},
	{160, 48, 23.2, 2.1, 4.0, 80*60 + 26}, {160, 60, 28.0, 2.1, 17.7, -1},
	{250, 12, 9.3, 1.3, 0, 128*60 + 33}, {250, 24, 15.4, 1.6, 0, 106*60 + 52}, {250, 36, 26.7, 1.3, 4.6, 123*60 + 46},
	{250, 48, -1, -1, 42.8, -1}, {250, 60, -1, -1, 99.0, -1},
}

func paperPoints() []report.Point {
	var out []report.Point
	for _, r := range paperRows {
		m := map[string]float64{"error_pct": r.errs}
		if r.avgS >= 0 {
			m["avg_response_s"] = r.avgS
		}
		if r.perS >= 0 {
			m["launches_per_s"] = r.perS
		}
		if r.launchS >= 0 {
			m["wall_s"] = r.launchS
		}
		out = append(out, report.Point{Scenario: "launch-storm", System: "paper",
			Params: map[string]any{"rtt_ms": int64(r.rtt), "concurrency": r.c, "hosts": 57}, Metrics: m})
	}
	return out
}

func notes(o Options, placement, e2e bool) []string {
	var out []string
	if placement {
		out = append(out, placementNotes(o)...)
	}
	if e2e {
		e := o.E2E
		out = append(out,
			fmt.Sprintf("End to end (launch-storm-e2e): %d hosts sized to fill (session limit %d, %.0f %% over the distinct users), logon limit %d; %d launches at each concurrency. A launch's session appears on its host a log-normal logon time after the broker's answer (median %s, σ %.2f: a Windows or xrdp logon), and the host's agent loop (the real agent.Diff every %s, heartbeats every 5 s) reports it, so a logon slot stays taken for the whole logon.",
				o.Hosts, e.sessionLimit(o.Hosts), 100*(e.Headroom-1), o.LogonLimit, e.Launches, e.LogonMedian, e.LogonSigma, e.SessionPoll),
			fmt.Sprintf("%.0f %% of launches are users launching again while their session runs (their client dropped; the host shows the session disconnected): each must come back to its own session, which shows active again %s later. %.0f %% of new sessions log off %s to %s after their logon, freeing their slot.",
				100*e.RelaunchShare, e.Reconnect, 100*e.LogoffShare, e.LogonMedian/4, e.LogonMedian*3/2),
			"Response time is the launch request's, waits for a host with a free logon slot included (the broker waits up to broker.busy_wait inside, then answers 503 with Retry-After and the client retries); time to desktop adds the session's drawn logon time (or reconnect time) to it. After each point the bench waits for the last logon and logoff to be reported and checks that the database holds exactly the sessions the hosts have, user by user, host and state.",
			"Bottleneck: hosts that were full when no host answered; otherwise the lower of the rates the logon limit allows (hosts × logon limit ÷ mean logon) and the database round trip allows (concurrency ÷ RTT), or the CPU when the bench's processes kept every core busy below both.",
			"The paper's figures time the brokering request with simulated VDA sessions that log on at once; they compare with the placement tables, and the end-to-end table shows what decides a storm of real logons.")
	}
	return out
}

func placementNotes(o Options) []string {
	return []string{
		fmt.Sprintf("Each point: a fresh database, a deskway broker in this process serving HTTPS on loopback, %d simulated session hosts registered through the agent API (join token, heartbeats every 5 s, logons reported in batches every %s as a real agent does), then %d launches by distinct users from a front end at fixed concurrency; untimed warm-up launches (one per worker) fill the connection pool first.", o.Hosts, o.LogonAfter, o.Launches),
		"PostgreSQL 15 from Debian runs durable (fsync and synchronous commit on) and is reached through deskway's latency proxy, which delays every byte by RTT/2 each way; the broker and the proxy, the clients and the database share this 2-core machine.",
		fmt.Sprintf("Per host: session limit %d, logon limit %d (launches not yet logged on); a launch that finds every host at its logon limit waits inside the broker and tries again (broker.busy_wait, 2 s), then gets 503 with Retry-After and the client retries: waits and retries count in its response time, and only launches that never succeed count as errors.", o.SessionLimit, o.LogonLimit),
		"Paper: XenApp/XenDesktop 7.7, 57 VDAs in one delivery group, SQL Server at the given RTT, 10,000 launches; its figures are typed in from the paper. N/A where it printed none.",
		"Placement is one SQL statement per launch (pick with FOR UPDATE SKIP LOCKED, reserve the slot, insert the session), so a launch costs one round trip to the database and no lock is held across the network.",
	}
}

func cell(m map[string]float64, err error, key string, f func(float64) string) string {
	if err != nil {
		return "–"
	}
	v, ok := m[key]
	if !ok {
		return "N/A"
	}
	return f(v)
}

func dur(s float64) string {
	d := time.Duration(s * float64(time.Second)).Round(time.Second)
	if d >= time.Hour {
		return fmt.Sprintf("%dh %dm %ds", int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
}

func write(res *report.Result, dir string) error {
	if err := res.WriteJSON(dir); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Brokering under database latency: deskway beside the paper\n\n`%s`\n\nMeasured %s on %d CPUs, %.0f GiB, Linux %s, %s.\n\n",
		res.Command, res.Started.Format(time.RFC3339), res.Machine.CPUs, float64(res.Machine.MemBytes)/(1<<30), res.Machine.Kernel, res.Machine.Go)
	fmt.Fprintf(&b, "Summary: %v", res.Summary)
	if len(res.SummaryText) > 0 {
		fmt.Fprintf(&b, " %v", res.SummaryText)
	}
	b.WriteString("\n\n")
	rtts, cs := axes(res)
	for _, rtt := range rtts {
		if rtt == 0 {
			continue
		}
		t := report.Table{Title: fmt.Sprintf("%d ms RTT", rtt), Head: []string{"Concurrent requests"}}
		for _, c := range cs {
			t.Head = append(t.Head, fmt.Sprint(c))
		}
		rows := []struct {
			label, key string
			f          func(float64) string
		}{
			{"Average response time (s)", "avg_response_s", func(v float64) string { return fmt.Sprintf("%.2f", v) }},
			{"Median response time (ms)", "median_ms", func(v float64) string { return fmt.Sprintf("%.0f", v) }},
			{"Brokering requests per second", "launches_per_s", func(v float64) string { return fmt.Sprintf("%.1f", v) }},
			{"Errors (%)", "error_pct", func(v float64) string { return fmt.Sprintf("%.2f", v) }},
			{"Time to launch 10k users", "wall_s", dur},
		}
		for _, r := range rows {
			for _, sys := range []string{"deskway-postgres", "paper"} {
				row := []string{r.label + " — " + sys}
				for _, c := range cs {
					m, err := find(res, sys, rtt, c)
					row = append(row, cell(m, err, r.key, r.f))
				}
				t.Rows = append(t.Rows, row)
			}
		}
		b.WriteString(t.Markdown())
	}
	if hasSystem(res, "deskway-sqlite") {
		t := report.Table{Title: "SQLite, embedded (no network between broker and database)", Head: []string{"Concurrent requests"}}
		for _, c := range cs {
			t.Head = append(t.Head, fmt.Sprint(c))
		}
		for _, r := range []struct{ label, key, fmtS string }{
			{"Average response time (ms)", "avg_response_s", "%.1f"}, {"Median response time (ms)", "median_ms", "%.1f"},
			{"Brokering requests per second", "launches_per_s", "%.0f"}, {"Errors (%)", "error_pct", "%.2f"}} {
			row := []string{r.label}
			for _, c := range cs {
				m, err := find(res, "deskway-sqlite", 0, c)
				v := m[r.key]
				if r.key == "avg_response_s" {
					v *= 1000
				}
				if err != nil {
					row = append(row, "–")
				} else {
					row = append(row, fmt.Sprintf(r.fmtS, v))
				}
			}
			t.Rows = append(t.Rows, row)
		}
		b.WriteString(t.Markdown())
	}
	for _, p := range res.Points {
		if p.Skipped != "" {
			fmt.Fprintf(&b, "- %s skipped: %s\n", p.System, p.Skipped)
		}
	}
	if hasScenario(res, "launch-storm-e2e") {
		b.WriteString(e2eTable(res))
	}
	b.WriteString("\n## How it was measured\n\n")
	for _, n := range res.Notes {
		b.WriteString("- " + n + "\n")
	}
	b.WriteString("\nCharts: `launches-per-second.svg`, `response-time.svg`.\n")
	if err := os.WriteFile(filepath.Join(dir, "result.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	var rate, resp []report.Series
	for _, rtt := range rtts {
		for _, sys := range []string{"deskway-postgres", "deskway-sqlite", "paper"} {
			var sr, sp report.Series
			sr.Name = fmt.Sprintf("%s %d ms", strings.TrimPrefix(sys, "deskway-"), rtt)
			sp.Name = sr.Name
			for _, c := range cs {
				m, err := find(res, sys, rtt, c)
				if err != nil {
					continue
				}
				if v, ok := m["launches_per_s"]; ok {
					sr.X, sr.Y = append(sr.X, float64(c)), append(sr.Y, v)
				}
				if v, ok := m["avg_response_s"]; ok {
					sp.X, sp.Y = append(sp.X, float64(c)), append(sp.Y, v)
				}
			}
			if len(sr.X) > 0 && (rtt == 10 || rtt == 250 || rtt == 0) {
				rate = append(rate, sr)
			}
			if len(sp.X) > 0 && (rtt == 10 || rtt == 250) {
				resp = append(resp, sp)
			}
		}
	}
	if err := report.LineChart(filepath.Join(dir, "launches-per-second.svg"), "Launches per second vs concurrency",
		"concurrent launches", "launches/s", rate, 0); err != nil {
		return err
	}
	return report.LineChart(filepath.Join(dir, "response-time.svg"), "Average response time vs concurrency",
		"concurrent launches", "seconds", resp, 0)
}

func hasSystem(res *report.Result, sys string) bool {
	for _, p := range res.Points {
		if p.System == sys && p.Skipped == "" {
			return true
		}
	}
	return false
}

// axes returns the RTTs and concurrencies measured for deskway.
func axes(res *report.Result) ([]int64, []int) {
	rs, cs := map[int64]bool{}, map[int]bool{}
	for _, p := range res.Points {
		if p.Scenario == "launch-storm" && strings.HasPrefix(p.System, "deskway") && p.Skipped == "" {
			rs[toInt64(p.Params["rtt_ms"])] = true
			cs[int(toInt64(p.Params["concurrency"]))] = true
		}
	}
	var r []int64
	for k := range rs {
		r = append(r, k)
	}
	var c []int
	for k := range cs {
		c = append(c, k)
	}
	sort.Slice(r, func(i, j int) bool { return r[i] < r[j] })
	sort.Ints(c)
	return r, c
}

func hasScenario(res *report.Result, scenario string) bool {
	for _, p := range res.Points {
		if p.Scenario == scenario && p.Skipped == "" {
			return true
		}
	}
	return false
}

// e2eTable is the end-to-end mode's table: a column per point.
func e2eTable(res *report.Result) string {
	var pts []report.Point
	for _, p := range res.Points {
		if p.Scenario == "launch-storm-e2e" && p.Skipped == "" {
			pts = append(pts, p)
		}
	}
	sort.SliceStable(pts, func(i, j int) bool {
		ri, rj := toInt64(pts[i].Params["rtt_ms"]), toInt64(pts[j].Params["rtt_ms"])
		if ri != rj {
			return ri < rj
		}
		return toInt64(pts[i].Params["concurrency"]) < toInt64(pts[j].Params["concurrency"])
	})
	t := report.Table{Title: "End to end: real logon times, hosts that fill, relaunches and logoffs (PostgreSQL)", Head: []string{"RTT / concurrent requests"}}
	for _, p := range pts {
		t.Head = append(t.Head, fmt.Sprintf("%d ms / %d", toInt64(p.Params["rtt_ms"]), toInt64(p.Params["concurrency"])))
	}
	rows := []struct {
		label, key, f string
	}{
		{"Launches (new users + relaunches)", "", ""},
		{"Brokering requests per second", "launches_per_s", "%.1f"},
		{"Median response time (ms)", "median_ms", "%.0f"},
		{"p90 response time (ms)", "p90_ms", "%.0f"},
		{"Median time to desktop (s)", "desktop_median_s", "%.1f"},
		{"p90 time to desktop (s)", "desktop_p90_s", "%.1f"},
		{"Reconnections to a running session", "reconnects", "%.0f"},
		{"Logoffs", "logoffs", "%.0f"},
		{"Errors (%)", "error_pct", "%.2f"},
		{"Busy waits in the broker", "busy_waits", "%.0f"},
		{"Client retries (503 + Retry-After)", "retries", "%.0f"},
		{"Rate the logon limit allows (/s)", "bound_logon_per_s", "%.1f"},
		{"Rate the database round trip allows (/s)", "bound_database_per_s", "%.0f"},
		{"Bench CPU (% of all cores)", "bench_cpu_pct", "%.0f"},
		{"Bottleneck", "", ""},
	}
	for _, r := range rows {
		row := []string{r.label}
		for _, p := range pts {
			m := p.Metrics
			switch {
			case r.label == "Bottleneck":
				row = append(row, fmt.Sprint(p.Params["bottleneck"]))
			case r.key == "":
				row = append(row, fmt.Sprintf("%.0f (%.0f + %.0f)", m["launches"], m["new_users"], m["relaunches"]))
			default:
				if v, ok := m[r.key]; ok {
					row = append(row, fmt.Sprintf(r.f, v))
				} else {
					row = append(row, "–")
				}
			}
		}
		t.Rows = append(t.Rows, row)
	}
	return t.Markdown()
}
