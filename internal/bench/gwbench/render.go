package gwbench

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"

	"github.com/deskway/deskway/internal/bench/report"
)

func (r *runner) write(dir string) error {
	if err := r.res.WriteJSON(dir); err != nil {
		return err
	}
	md := r.markdown()
	if err := writeFile(filepath.Join(dir, "result.md"), md); err != nil {
		return err
	}
	return r.charts(dir)
}

func f(v float64, d int) string {
	if v < 0 {
		return "–"
	}
	return fmt.Sprintf("%.*f", d, v)
}

// points returns the points of a scenario and system.
func (r *runner) points(scenario, system string) []report.Point {
	var out []report.Point
	for _, p := range r.res.Points {
		if p.Scenario == scenario && p.System == system {
			out = append(out, p)
		}
	}
	return out
}

func param(p report.Point, k string) string { return fmt.Sprint(p.Params[k]) }

// summaryFor finds the 40 ms count of system in scenario with matching params.
func (r *runner) summaryFor(scenario, system, key, val string) string {
	for _, p := range r.points(scenario+"-summary", system) {
		if key == "" || param(p, key) == val {
			s := f(p.Metrics["max_tunnels_40ms"], 0)
			if p.Metrics["lower_bound"] == 1 {
				s = "≥" + s
			}
			return s
		}
	}
	return "–"
}

func (r *runner) markdown() string {
	var b strings.Builder
	s := r.res.Summary
	m := r.res.Machine
	fmt.Fprintf(&b, "# Gateway capacity: deskway beside the direct path, HAProxy and the paper\n\n")
	fmt.Fprintf(&b, "Command: `%s`  \nStarted: %s  \nMachine: %d CPUs, %.0f GiB, Linux %s, %s. The load generator, the echo server (the paper's TSGSServer) and the relay under test share these CPUs; the paper's gateway had 4 dedicated cores.\n\n",
		r.res.Command, r.res.Started.Format("2006-01-02 15:04 MST"), m.CPUs, float64(m.MemBytes)/(1<<30), m.Kernel, m.Go)
	b.WriteString("How it is measured: each tunnel sends one request per interval with one request in flight and times it from before the send to the last byte of the answer (the paper's method). Tunnels are ramped in steps; each step warms up, then records every round trip in a window. *Added p99* is the relay's p99 minus the direct path's p99 at the same tunnel count in the same run; the *40 ms count* is where it crosses 40 ms (interpolated between steps; ≥ marks a ramp that never crossed). deskway tunnels use the MS-TSGU websocket transport with a PAA token; direct and HAProxy use the same TLS with no tunnel protocol. CPU is the relay process's user+system time from /proc.\n\n")
	times := fmt.Sprintf("%d times", r.o.Runs)
	if r.o.Runs == 1 {
		times = "once"
	}
	fmt.Fprintf(&b, "Runs: the KW v1 and v2 ramps and the throughput test ran **%s for every system**, interleaved: in each run the direct path first, then deskway and HAProxy, taking turns to go first (throughput: the three systems' order turns every run). Each headline is the **median run**, with the smallest and largest run beside it; each ratio is taken within one run, and its median and worst over runs are given. Every KW v1 ramp goes on through %s tunnels even past 40 ms, so CPU per round trip and memory per tunnel are compared at equal load. The other tables come from one run of every system.\n\n",
		times, joinInts(r.o.CPULoads))
	if suites := r.suiteLine(); suites != "" {
		b.WriteString(suites)
	}
	if r.hapErr != nil {
		fmt.Fprintf(&b, "HAProxy was not measured: %s.\n\n", r.hapErr)
	}

	headline := report.Table{Title: "Table 1 and 3: tunnels under 40 ms added response time, median run (min–max)", Head: []string{"scenario", "deskway", "direct (own p99 ≤ 40 ms)", "HAProxy", "deskway / HAProxy, median (worst)", "deskway / direct, median (worst)", "paper (4 cores)"}}
	for _, kw := range []struct{ name, label string }{{"kw1", "KW v1: 90 B / 90 B every 100 ms"}, {"kw2", "KW v2: 25 B / 1669 B every 200 ms"}} {
		if _, ok := s[kw.name+"_max_tunnels_40ms"]; !ok {
			continue
		}
		direct := spreadCell(s, "direct_"+kw.name+"_max_tunnels_40ms", 0)
		toDirect := ratioCell(s, kw.name+"_ratio_direct")
		if s["direct_"+kw.name+"_lower_bound"] == 1 {
			direct, toDirect = "≥ "+direct, "≤ "+toDirect
		}
		headline.Rows = append(headline.Rows, []string{kw.label, spreadCell(s, kw.name+"_max_tunnels_40ms", 0), direct,
			spreadCell(s, "haproxy_"+kw.name+"_max_tunnels_40ms", 0), ratioCell(s, kw.name+"_ratio_haproxy"), toDirect, r.summaryFor(kw.name, "paper", "", "")})
	}
	if len(headline.Rows) > 0 {
		b.WriteString(headline.Markdown())
	}
	if len(r.o.CPULoads) > 0 {
		if _, ok := s[fmt.Sprintf("kw1_cpu_us_per_roundtrip_at_%d", r.o.CPULoads[0])]; ok {
			t := report.Table{Title: "Gateway CPU per relayed KW v1 round trip and memory per tunnel at equal load, median run", Head: []string{"tunnels", "deskway CPU µs", "HAProxy CPU µs", "deskway / HAProxy, median (worst)", "deskway KiB per tunnel", "HAProxy KiB per tunnel", "runs (deskway, HAProxy)"}}
			for _, n := range r.o.CPULoads {
				at := fmt.Sprintf("_at_%d", n)
				t.Rows = append(t.Rows, []string{fmt.Sprint(n), optional(s, "kw1_cpu_us_per_roundtrip"+at, 1), optional(s, "haproxy_kw1_cpu_us_per_roundtrip"+at, 1),
					ratioCell(s, "kw1_cpu_ratio_haproxy"+at), kib(s, "bytes_per_tunnel"+at), kib(s, "haproxy_bytes_per_tunnel"+at),
					optional(s, "kw1_cpu_runs"+at, 0) + ", " + optional(s, "haproxy_kw1_cpu_runs"+at, 0)})
			}
			b.WriteString(t.Markdown())
			fmt.Fprintf(&b, "Memory per tunnel is (RSS at N − RSS idle) / N. The paper's gateway: 325 µs of CPU per round trip (4 cores at 100 %% for 1,230 tunnels), 0.61–0.69 MB per tunnel (Table 5). At deskway's median CPU per round trip a dedicated core would carry **%.0f** KW v1 tunnels (paper: 308).\n\n", s["kw1_projected_tunnels_per_core"])
		}
	}
	for _, sc := range []string{"kw1", "kw2"} {
		t := report.Table{Title: "Table 2: response time per tunnel count, " + sc + ", every run", Head: []string{"run", "tunnels", "system", "p50 ms", "p99 ms", "max ms", "added p99 ms", "relay CPU %", "CPU µs/round trip", "RSS MiB", "generator CPU %"}}
		for _, sys := range []string{"direct", "deskway", "haproxy"} {
			for _, p := range r.points(sc, sys) {
				mm := p.Metrics
				rss := "–"
				if v, ok := mm["rss_bytes"]; ok {
					rss = f(v/(1<<20), 1)
				}
				t.Rows = append(t.Rows, []string{param(p, "run"), param(p, "tunnels"), sys, f(mm["p50_ms"], 2), f(mm["p99_ms"], 2), f(mm["max_ms"], 1), f(mm["added_p99_ms"], 2),
					optional(mm, "cpu_pct", 0), optional(mm, "cpu_us_per_roundtrip", 1), rss, f(mm["gen_cpu_pct"], 0)})
			}
		}
		if len(t.Rows) > 0 {
			b.WriteString(t.Markdown())
		}
	}
	if len(r.points("packet-size-summary", "deskway")) > 0 {
		t := report.Table{Title: "Table 6: packet size (every 100 ms) and tunnels under 40 ms", Head: []string{"packet bytes", "deskway", "direct", "HAProxy", "paper"}}
		for _, size := range []string{"10", "90", "200", "500", "1000", "2000"} {
			t.Rows = append(t.Rows, []string{size, r.summaryFor("packet-size", "deskway", "packet_bytes", size), r.summaryFor("packet-size", "direct", "packet_bytes", size),
				r.summaryFor("packet-size", "haproxy", "packet_bytes", size), r.summaryFor("packet-size", "paper", "packet_bytes", size)})
		}
		b.WriteString(t.Markdown())
	}
	if len(r.points("frequency-summary", "deskway")) > 0 {
		t := report.Table{Title: "Table 7: interval between 90-byte packets and tunnels under 40 ms", Head: []string{"interval ms", "deskway", "direct", "HAProxy", "paper"}}
		for _, ms := range []string{"10", "100", "500", "1000"} {
			t.Rows = append(t.Rows, []string{ms, r.summaryFor("frequency", "deskway", "interval_ms", ms), r.summaryFor("frequency", "direct", "interval_ms", ms),
				r.summaryFor("frequency", "haproxy", "interval_ms", ms), r.summaryFor("frequency", "paper", "interval_ms", ms)})
		}
		b.WriteString(t.Markdown())
	}
	if len(r.points("cpus-summary", "deskway")) > 0 {
		t := report.Table{Title: "Table 4: CPUs given to the relay (taskset, GOMAXPROCS / nbthread), KW v1", Head: []string{"CPUs", "deskway", "HAProxy", "paper"}}
		for _, c := range []string{"1", "2"} {
			t.Rows = append(t.Rows, []string{c, r.summaryFor("cpus", "deskway", "cpus", c), r.summaryFor("cpus", "haproxy", "cpus", c), r.summaryFor("cpus", "paper", "cpus", c)})
		}
		t.Rows = append(t.Rows, []string{"4", "–", "–", r.summaryFor("cpus", "paper", "cpus", "4")})
		b.WriteString(t.Markdown())
	}
	if _, ok := s["farm1_kw1_max_tunnels_40ms"]; ok {
		t := report.Table{Title: "Table 9: gateway farms, KW v1 tunnels under 40 ms, median run (min–max)", Head: []string{"nodes", "in front", "deskway", "paper"}}
		t.Rows = append(t.Rows, []string{"1", "nothing", spreadCell(s, "farm1_kw1_max_tunnels_40ms", 0), r.summaryFor("farm", "paper", "nodes", "1")})
		t.Rows = append(t.Rows, []string{"2", "clients rotate (round-robin DNS)", spreadCell(s, "farm2_kw1_max_tunnels_40ms", 0), r.summaryFor("farm", "paper", "nodes", "2")})
		t.Rows = append(t.Rows, []string{"2", "HAProxy (deploy/haproxy/gateway-farm.cfg)", spreadCell(s, "farm2_haproxy_kw1_max_tunnels_40ms", 0), "–"})
		b.WriteString(t.Markdown())
		fmt.Fprintf(&b, "On one 2-core machine a second node shares the same CPUs, so it adds no capacity here. Two nodes behind HAProxy against one node alone, per run: **%s × median, %s × worst** (HAProxy's own relaying shares the cores too).\n\n",
			f(s["farm2_haproxy_ratio_1node_median"], 2), f(s["farm2_haproxy_ratio_1node_worst"], 2))
		for _, p := range r.points("farm-failover", "deskway-2node") {
			fmt.Fprintf(&b, "Failover: %.0f KW v1 tunnels over two nodes, one node killed (SIGKILL): **%.0f tunnels lost**, all reopened on the surviving node in **%.2f s** (clients re-dial through the rotation; -1 means not all came back within 60 s).\n\n",
				p.Metrics["tunnels"], s["farm_failover_tunnels_lost"], s["farm_failover_recover_seconds"])
		}
	}
	if _, ok := s["throughput_single_gbps"]; ok {
		t := report.Table{Title: fmt.Sprintf("Throughput (ctsTraffic-like, host to client, %s per run), Gbit/s, median run (min–max)", r.o.ThroughputD), Head: []string{"streams", "deskway", "direct", "HAProxy", "deskway / direct, median (worst)", "deskway / HAProxy, median (worst)", "paper (RAS GRE, 10 cores)"}}
		for _, st := range []struct{ n, key, paper string }{{"1", "single", "0.4–0.5"}, {"8", "multi", "2.0 (many)"}} {
			t.Rows = append(t.Rows, []string{st.n, spreadCell(s, "throughput_"+st.key+"_gbps", 2), spreadCell(s, "direct_throughput_"+st.key+"_gbps", 2),
				spreadCell(s, "haproxy_throughput_"+st.key+"_gbps", 2),
				f(s["throughput_"+st.key+"_ratio_direct"], 2) + " (" + f(s["throughput_"+st.key+"_ratio_direct_worst"], 2) + ")",
				ratioCell(s, "throughput_"+st.key+"_ratio_haproxy"), st.paper})
		}
		b.WriteString(t.Markdown())
	}
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString("## Summary keys\n\n| key | value |\n|---|---|\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %g |\n", k, s[k])
	}
	if len(r.res.Notes) > 0 {
		b.WriteString("\n## What limits the result\n\n")
		for _, n := range r.res.Notes {
			b.WriteString("- " + n + "\n")
		}
	}
	var charts []string
	for _, sc := range []string{"kw1", "kw2"} {
		if len(r.points(sc, "deskway")) > 0 {
			charts = append(charts, "`response-"+sc+".svg`")
		}
	}
	if len(r.points("packet-size-summary", "deskway")) > 0 {
		charts = append(charts, "`packet-size.svg`")
	}
	if _, ok := s["throughput_single_gbps"]; ok {
		charts = append(charts, "`throughput.svg`")
	}
	if len(charts) > 0 {
		b.WriteString("\nCharts: " + strings.Join(charts, ", ") + ".\n")
	}
	return b.String()
}

// spreadCell renders key's median with its min and max.
func spreadCell(s map[string]float64, key string, d int) string {
	v, ok := s[key]
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%s (%s–%s)", f(v, d), f(s[key+"_min"], d), f(s[key+"_max"], d))
}

// ratioCell renders a per-run ratio's median and worst.
func ratioCell(s map[string]float64, key string) string {
	v, ok := s[key+"_median"]
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%s (%s)", f(v, 2), f(s[key+"_worst"], 2))
}

func kib(s map[string]float64, key string) string {
	v, ok := s[key]
	if !ok {
		return "–"
	}
	return f(v/1024, 1)
}

func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, " and ")
}

// suiteLine says what TLS every system negotiated and how HAProxy was set up.
func (r *runner) suiteLine() string {
	var parts []string
	for _, p := range r.res.Points {
		if p.Scenario == "tls" {
			parts = append(parts, fmt.Sprintf("%s: %v", p.System, p.Params["negotiated"]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	sort.Strings(parts)
	return fmt.Sprintf("TLS negotiated by the bench's client (every system must agree, or the run fails): %s. HAProxy runs with `nbthread` %d (one per CPU), `tune.bufsize %d` (deskway's relay reads 64 KiB at a time) and `ssl-default-bind-ciphersuites %s`.\n\n",
		strings.Join(parts, "; "), runtime.NumCPU(), haproxyBufSize, benchCipherSuite)
}

func optional(m map[string]float64, k string, d int) string {
	if v, ok := m[k]; ok {
		return f(v, d)
	}
	return "–"
}

func (r *runner) charts(dir string) error {
	for _, sc := range []string{"kw1", "kw2"} {
		var series []report.Series
		for _, sys := range []string{"direct", "deskway", "haproxy"} {
			run := r.medianRun(sc, sys)
			var x, y []float64
			for _, p := range r.points(sc, sys) {
				if v := p.Metrics["p99_ms"]; v >= 0 && param(p, "run") == run {
					x, y = append(x, p.Metrics["tunnels"]), append(y, v)
				}
			}
			if len(x) > 0 {
				series = append(series, report.Series{Name: sys + " (run " + run + ")", X: x, Y: y})
			}
		}
		if len(series) > 0 {
			if err := report.LineChart(filepath.Join(dir, "response-"+sc+".svg"), "p99 response time vs tunnels ("+sc+"), each system's median run", "tunnels", "p99 ms", series, thresholdMs); err != nil {
				return err
			}
		}
	}
	if len(r.points("packet-size-summary", "deskway")) > 0 {
		var series []report.Series
		for _, sys := range []string{"deskway", "direct", "haproxy", "paper"} {
			var x, y []float64
			for _, p := range r.points("packet-size-summary", sys) {
				var size float64
				fmt.Sscan(param(p, "packet_bytes"), &size)
				x, y = append(x, size), append(y, p.Metrics["max_tunnels_40ms"])
			}
			idx := make([]int, len(x))
			for i := range idx {
				idx[i] = i
			}
			sort.Slice(idx, func(a, b int) bool { return x[idx[a]] < x[idx[b]] })
			var sx, sy []float64
			for _, i := range idx {
				sx, sy = append(sx, x[i]), append(sy, y[i])
			}
			if len(sx) > 0 {
				series = append(series, report.Series{Name: sys, X: sx, Y: sy})
			}
		}
		if err := report.LineChart(filepath.Join(dir, "packet-size.svg"), "Tunnels under 40 ms vs packet size (Figure 2)", "packet bytes", "tunnels", series, 0); err != nil {
			return err
		}
	}
	if _, ok := r.res.Summary["throughput_single_gbps"]; ok {
		var series []report.Series
		s := r.res.Summary
		for sys, prefix := range map[string]string{"deskway": "", "direct": "direct_", "haproxy": "haproxy_"} {
			one, ok1 := s[prefix+"throughput_single_gbps"]
			eight, ok8 := s[prefix+"throughput_multi_gbps"]
			if ok1 && ok8 {
				series = append(series, report.Series{Name: sys, Y: []float64{one, eight}})
			}
		}
		slices.SortFunc(series, func(a, b report.Series) int { return strings.Compare(a.Name, b.Name) })
		if err := report.BarChart(filepath.Join(dir, "throughput.svg"), "Throughput, host to client, median run", "Gbit/s", []string{"1 stream", "8 streams"}, series); err != nil {
			return err
		}
	}
	return nil
}

// medianRun is the run of system whose 40 ms count in scenario is the
// median (the lower middle of an even count).
func (r *runner) medianRun(scenario, system string) string {
	ps := r.points(scenario+"-summary", system)
	if len(ps) == 0 {
		return ""
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Metrics["max_tunnels_40ms"] < ps[j].Metrics["max_tunnels_40ms"] })
	return param(ps[(len(ps)-1)/2], "run")
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }
