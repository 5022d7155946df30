package bootstorm

import (
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/deskway/deskway/internal/bench/report"
)

// metric returns a point's metric for system at n clients in scenario.
func (r *runner) metric(scenario, sys string, n int, key string) (float64, bool) {
	for _, p := range r.res.Points {
		if p.Scenario == scenario && p.System == sys && p.Skipped == "" {
			if c, ok := p.Params["clients"].(int); ok && c == n {
				v, ok := p.Metrics[key]
				return v, ok
			}
		}
	}
	return 0, false
}

func (r *runner) summarize(systems []system) {
	s := r.res.Summary
	// The largest step at which every run, and every smaller step's every
	// run, had no slow request and no failed client.
	steps := slices.Sorted(slices.Values(r.o.Clients))
	best := 0
	for _, n := range steps {
		slow, ok1 := r.metric("storm", "deskway", n, "slow_requests_max")
		failed, ok2 := r.metric("storm", "deskway", n, "failed_clients_max")
		if !ok1 || !ok2 || slow > 0 || failed > 0 {
			break
		}
		best = n
	}
	if len(steps) > 0 {
		s["max_clients_no_slow_requests"] = float64(best)
	}
	// Ratios at every step, each system's median run against the other's
	// (the keys BENCH.md names), and worst run against worst run (the same
	// keys with _worst_run); the summary keeps the worst step of each.
	// Slow requests compare as (a+1)/(b+1), so that none against none is 1.
	ratio := func(a, b float64) float64 { return (a + 1) / (b + 1) }
	for _, run := range []struct{ suffix, slow, boot, cpu string }{{"", "slow_requests", "boot_median_s", "cpu_s"}, {"_worst_run", "slow_requests_max", "boot_median_s_max", "cpu_s_max"}} {
		for _, n := range steps {
			d, ok := r.metric("storm", "deskway", n, run.slow)
			if !ok {
				continue
			}
			if f, ok := r.metric("storm", floorName, n, run.slow); ok {
				k := "slow_ratio_floor_max" + run.suffix
				s[k] = report.Round(max(s[k], ratio(d, f)), 3)
			}
			db, ok1 := r.metric("storm", "deskway", n, run.boot)
			fb, ok2 := r.metric("storm", floorName, n, run.boot)
			if ok1 && ok2 && fb > 0 {
				k := "boot_ratio_floor_max" + run.suffix
				s[k] = report.Round(max(s[k], db/fb), 3)
			}
			// The server's CPU-seconds a storm: unlike CPU %, which falls
			// as a busy machine stretches the storm, this is the work
			// itself.
			dc, ok1 := r.metric("storm", "deskway", n, run.cpu)
			fc, ok2 := r.metric("storm", floorName, n, run.cpu)
			if ok1 && ok2 && fc > 0 {
				k := "cpu_ratio_floor_max" + run.suffix
				s[k] = report.Round(max(s[k], dc/fc), 3)
			}
			bestPeer := math.Inf(1)
			for _, sys := range systems {
				if sys.name == "deskway" || sys.name == floorName {
					continue
				}
				if v, ok := r.metric("storm", sys.name, n, run.slow); ok {
					bestPeer = min(bestPeer, v)
				}
			}
			if !math.IsInf(bestPeer, 1) {
				k := "slow_ratio_best_peer_max" + run.suffix
				s[k] = report.Round(max(s[k], ratio(d, bestPeer)), 3)
			}
		}
	}
	peak := map[string]float64{}
	for _, sys := range systems {
		for _, n := range r.o.Readers {
			if v, ok := r.metric("read", sys.name, n, "read_gbps"); ok {
				peak[sys.name] = max(peak[sys.name], v)
			}
		}
	}
	if v, ok := peak["deskway"]; ok {
		// The median run of deskway's best reader count; its worst run
		// at that count beside it.
		s["read_gbps"] = v
		for _, n := range r.o.Readers {
			if m, ok := r.metric("read", "deskway", n, "read_gbps"); ok && m == v {
				if w, ok := r.metric("read", "deskway", n, "read_gbps_min"); ok {
					s["read_gbps_worst_run"] = w
				}
				break
			}
		}
		bestPeer := 0.0
		for name, g := range peak {
			if name != "deskway" && name != floorName {
				bestPeer = max(bestPeer, g)
			}
		}
		if bestPeer > 0 {
			s["read_ratio_best_peer"] = report.Round(v/bestPeer, 3)
		}
	}
	if len(steps) > 0 {
		top := steps[len(steps)-1]
		if v, ok := r.metric("storm", "deskway", top, "rss_per_client_bytes"); ok {
			s["rss_bytes_per_client"] = v
		}
		if v, ok := r.metric("storm", "deskway", top, "rss_beyond_cache_per_client_bytes"); ok {
			s["rss_bytes_per_client_excl_cache"] = v
		}
	}
}

func (r *runner) write(systems []system) error {
	if err := os.MkdirAll(r.o.Out, 0o755); err != nil {
		return err
	}
	if err := r.res.WriteJSON(r.o.Out); err != nil {
		return err
	}
	var md strings.Builder
	m := r.res.Machine
	fmt.Fprintf(&md, "# vDisk boot storm: deskway stream beside nbd-server, nbdkit, qemu-nbd and the paper\n\n")
	fmt.Fprintf(&md, "Command: `%s`  \nStarted: %s  \nMachine: %d CPUs, %d GiB, Linux %s, %s. The clients (NBD clients on one event loop per CPU in the bench process, simple replies) and the server share these CPUs; the paper's server had a dual-core Xeon 5160 and its 100 clients were separate PCs on gigabit Ethernet.\n\n",
		r.o.Command, r.res.Started.Format("2006-01-02 15:04 UTC"), m.CPUs, m.MemBytes>>30, m.Kernel, m.Go)
	fmt.Fprintf(&md, "How it is measured: every client replays the same recorded boot (%d requests: %.1f MiB read, %.1f MiB written, spread over %.1f s; `internal/bench/bootstorm/boot-trace.csv`, recorded by deskway from a qemu VM booting Debian's kernel and loading programs and libraries from an ext4 vDisk). A storm starts N clients at the same instant; every system runs every step %d times, the systems taking turns run by run, each on a freshly started server, and each figure compared (slow requests, failed clients, boot time, throughput) is its median over the runs, the median run by that figure, with the worst run beside it where it matters; each client keeps its recorded pace (think time × %g) with at most %d requests in flight, and its boot time runs from its first connection attempt to its last answer. A *slow request* is one answered after more than 200 ms, the paper's UDP retry timeout, so it counts what the paper counts as retries. Server CPU and memory come from /proc for the server process and its children; the server is restarted for every step. The aggregate read test has N readers replay only the trace's reads through boot exports (deskway's write caches, the peers' copy-on-write layers) with no think time and 8 in flight, for %s.\n\n",
		len(r.tr.ops), float64(r.tr.readBytes)/(1<<20), float64(r.tr.writeBytes)/(1<<20), r.tr.span.Seconds(), r.o.Runs, r.o.TimeScale, r.o.QueueDepth, r.o.ReadFor)
	md.WriteString("Systems: ")
	var notes []string
	for _, s := range systems {
		notes = append(notes, fmt.Sprintf("**%s** (%s)", s.name, s.note))
	}
	md.WriteString(strings.Join(notes, "; ") + ".\n\n")
	for _, p := range r.res.Points {
		if p.Skipped != "" {
			fmt.Fprintf(&md, "Not measured: **%s**: %s.\n\n", p.System, p.Skipped)
		}
	}

	table := func(title, key string, scale float64, digits int) {
		t := report.Table{Title: title, Head: []string{"clients"}}
		for _, s := range systems {
			t.Head = append(t.Head, s.name)
		}
		for _, n := range r.o.Clients {
			row := []string{fmt.Sprint(n)}
			for _, s := range systems {
				if v, ok := r.metric("storm", s.name, n, key); ok {
					cell := fmt.Sprintf("%.*f", digits, v*scale)
					if f, _ := r.metric("storm", s.name, n, "failed_clients"); f > 0 && key == "boot_median_s" {
						cell += fmt.Sprintf(" (%d failed)", int(f))
					}
					row = append(row, cell)
				} else {
					row = append(row, "–")
				}
			}
			t.Rows = append(t.Rows, row)
		}
		md.WriteString(t.Markdown())
	}
	if slices.Contains(r.o.Scenarios, "storm") {
		table("Figure 3: boot time, median seconds (paper: 27 s from a local disk; about 15 s more at 100 clients than at 25)", "boot_median_s", 1, 2)
		table("Boot time, slowest client, seconds", "boot_max_s", 1, 2)
		table("Figure 4: requests slower than 200 ms, median run (the paper's retries: 2 to 6 over a 6-minute storm at 75–100 clients)", "slow_requests", 1, 0)
		table("Requests slower than 200 ms, worst run", "slow_requests_max", 1, 0)
		table("Request latency p99, ms", "request_p99_ms", 1, 1)
		table("Figure 5: server CPU % of one core over the storm (paper: peaks of 85 % at 50 clients, 100 % from 75)", "cpu_pct", 1, 0)
		table("Server CPU-seconds a storm (user + system), median run", "cpu_s", 1, 1)
		table("Figure 6: server peak RSS, MiB (paper: under 1 GB of 4 GB used at 100 clients)", "rss_peak_bytes", 1.0/(1<<20), 0)
		table("Figure 7: data served during the storm, MB/s (paper: two gigabit links at 98 % from 75 clients)", "read_mb_s", 1, 0)
		t := report.Table{Title: "deskway memory per connected client, median run", Head: []string{"clients", "bytes per client, write cache included", "beyond its write cache"}}
		for _, n := range r.o.Clients {
			all, ok := r.metric("storm", "deskway", n, "rss_per_client_bytes")
			if !ok {
				continue
			}
			beyond := "–"
			if v, ok := r.metric("storm", "deskway", n, "rss_beyond_cache_per_client_bytes"); ok {
				beyond = fmt.Sprintf("%.0f", v)
			}
			t.Rows = append(t.Rows, []string{fmt.Sprint(n), fmt.Sprintf("%.0f", all), beyond})
		}
		md.WriteString(t.Markdown())
	}
	if slices.Contains(r.o.Scenarios, "read") {
		t := report.Table{Title: "Aggregate read throughput, Gbit/s", Head: []string{"readers"}}
		for _, s := range systems {
			t.Head = append(t.Head, s.name)
		}
		for _, n := range r.o.Readers {
			row := []string{fmt.Sprint(n)}
			for _, s := range systems {
				if v, ok := r.metric("read", s.name, n, "read_gbps"); ok {
					row = append(row, fmt.Sprintf("%.2f", v))
				} else {
					row = append(row, "–")
				}
			}
			t.Rows = append(t.Rows, row)
		}
		md.WriteString(t.Markdown())
	}
	md.WriteString("## Summary keys\n\nKeys without a suffix compare each system's median run of the figure compared (by boot time for boot ratios, by slow requests for slow-request ratios) with the other's at the same step; keys ending in `_worst_run` compare worst run with worst run. Each ratio key keeps its worst step.\n\n")
	st := report.Table{Head: []string{"key", "value"}}
	for _, k := range slices.Sorted(maps.Keys(r.res.Summary)) {
		st.Rows = append(st.Rows, []string{k, fmt.Sprintf("%g", r.res.Summary[k])})
	}
	md.WriteString(st.Markdown())
	for _, n := range r.res.Notes {
		md.WriteString(n + "\n\n")
	}

	var boot, slow []report.Series
	for _, s := range systems {
		b := report.Series{Name: s.name}
		sl := report.Series{Name: s.name}
		for _, n := range r.o.Clients {
			if v, ok := r.metric("storm", s.name, n, "boot_median_s"); ok {
				b.X, b.Y = append(b.X, float64(n)), append(b.Y, v)
			}
			if v, ok := r.metric("storm", s.name, n, "slow_requests"); ok {
				sl.X, sl.Y = append(sl.X, float64(n)), append(sl.Y, v)
			}
		}
		boot, slow = append(boot, b), append(slow, sl)
	}
	var charts []string
	if slices.Contains(r.o.Scenarios, "storm") {
		if err := report.LineChart(filepath.Join(r.o.Out, "boot-time.svg"), "Median boot time in a storm", "clients booting at once", "seconds", boot, 0); err != nil {
			return err
		}
		if err := report.LineChart(filepath.Join(r.o.Out, "slow-requests.svg"), "Requests over 200 ms (retries)", "clients booting at once", "requests", slow, 0); err != nil {
			return err
		}
		charts = append(charts, "`boot-time.svg`", "`slow-requests.svg`")
	}
	if slices.Contains(r.o.Scenarios, "read") {
		var labels []string
		var series []report.Series
		for _, n := range r.o.Readers {
			labels = append(labels, fmt.Sprintf("%d readers", n))
		}
		for _, s := range systems {
			se := report.Series{Name: s.name}
			for i, n := range r.o.Readers {
				v, _ := r.metric("read", s.name, n, "read_gbps")
				se.X, se.Y = append(se.X, float64(i)), append(se.Y, v)
			}
			series = append(series, se)
		}
		if err := report.BarChart(filepath.Join(r.o.Out, "read-throughput.svg"), "Aggregate read throughput", "Gbit/s", labels, series); err != nil {
			return err
		}
		charts = append(charts, "`read-throughput.svg`")
	}
	fmt.Fprintf(&md, "Charts: %s.\n", strings.Join(charts, ", "))
	return os.WriteFile(filepath.Join(r.o.Out, "result.md"), []byte(md.String()), 0o644)
}
