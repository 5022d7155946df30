package sessionhost

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/config"
)

// paperServers are the Terminal Server paper's x64 Knowledge Worker
// results (its Table 1): the users each server held, and its cores.
var paperServers = []struct {
	server string
	cores  int
	users  float64
}{
	{"HP DL385, 2 × Opteron", 2, 240},
	{"HP DL585, 4 × Opteron", 4, 380},
	{"HP DL585, 4 × dual-core Opteron", 8, 620},
}

// atCapacity is the step the summary's per-session figures come from:
// the last one before the degradation point (the host full but serving
// well), or the last step of a ramp that never degraded.
func atCapacity(out *Outcome) (Step, bool) {
	var best Step
	found := false
	for _, s := range out.Steps {
		if out.Degradation.Users > 0 && s.Users >= out.Degradation.Users {
			break
		}
		if s.LogonFailed == "" {
			best, found = s, true
		}
	}
	return best, found
}

func summarize(res *report.Result, out *Outcome, o Options) {
	for i, r := range out.Ramps {
		for _, s := range r.Steps {
			p := stepPoint("ramp-gateway", s)
			p.Params["ramp"] = i + 1
			res.Points = append(res.Points, p)
		}
		res.Points = append(res.Points, report.Point{Scenario: "degradation", System: "deskway",
			Params:  map[string]any{"ramp": i + 1, "why": r.Degradation.Why, "limiting_counter": r.Limiting},
			Metrics: map[string]float64{"degradation_users": float64(r.Degradation.Users), "baseline_ms": report.Round(r.Baseline, 1)}})
	}
	for _, s := range out.BrokerSteps {
		res.Points = append(res.Points, stepPoint("ramp-broker", s))
	}
	for _, p := range paperServers {
		res.Points = append(res.Points, report.Point{Scenario: "capacity", System: "paper", Params: map[string]any{"server": p.server, "cores": p.cores},
			Metrics: map[string]float64{"users": p.users, "users_per_core": p.users / float64(p.cores)}})
	}
	// One rule for capacity: the users a ramp held before its degradation
	// point (one below it), given for the median ramp and for the worst.
	cores := runtime.NumCPU()
	held := func(d Degradation) int { return max(d.Users-1, 0) }
	capacity, worstCapacity := held(out.Degradation), 0
	if len(out.Ramps) > 0 {
		worstCapacity = held(out.Ramps[out.Worst].Degradation)
	}
	for _, c := range []struct {
		run   string
		users int
	}{{"median", capacity}, {"worst", worstCapacity}} {
		res.Points = append(res.Points, report.Point{Scenario: "capacity", System: "deskway", Params: map[string]any{"server": "this machine (" + c.run + " ramp)", "cores": cores, "run": c.run},
			Metrics: map[string]float64{"users": float64(c.users), "users_per_core": float64(c.users) / float64(cores)}})
	}

	res.Summary["ramps"] = float64(len(out.Ramps))
	res.Summary["degradation_users"] = float64(out.Degradation.Users)
	if len(out.Ramps) > 0 {
		res.Summary["degradation_users_worst"] = float64(out.Ramps[out.Worst].Degradation.Users)
	}
	res.Summary["baseline_ms"] = report.Round(out.Baseline, 1)
	res.Summary["suggested_session_limit"] = float64(out.SuggestLimit)
	res.Summary["users_per_core"] = report.Round(float64(capacity)/float64(cores), 1)
	res.Summary["users_per_core_worst"] = report.Round(float64(worstCapacity)/float64(cores), 1)
	res.SummaryText["limiting_counter"] = out.Limiting
	res.SummaryText["degradation_reason"] = out.Degradation.Why
	if out.Degradation.Users == 0 {
		res.SummaryText["degradation_reason"] = fmt.Sprintf("none within %d users", len(out.Steps))
	}
	if s, ok := atCapacity(out); ok {
		res.Summary["memory_bytes_per_session"] = math.Round(s.MemPerSession)
		res.Summary["client_cpu_pct"] = report.Round(s.ClientCPUPct, 1)
		res.Summary["host_cpu_pct"] = report.Round(s.HostCPUPct, 1)
	}
	if len(out.BrokerSteps) > 0 {
		res.Summary["broker_session_limit"] = float64(out.BrokerLimit)
		res.Summary["broker_last_placement_users"] = float64(out.BrokerLast)
		if out.Degradation.Users > 0 {
			res.Summary["broker_gap_users"] = float64(out.Degradation.Users - out.BrokerLast)
		}
		if w := out.Ramps[out.Worst].Degradation.Users; w > 0 {
			res.Summary["broker_gap_users_worst"] = float64(w - out.BrokerLast)
		}
	}
	res.Notes = []string{
		fmt.Sprintf("Users log on one every %v, each with xfreerdp (%s, %d bpp, no wallpaper or themes) on an Xvfb, through deskway's gateway with a token of its own (`deskway token`), to xrdp on this machine. Each session's xterm runs the workload: edit (an editor in a new window, a sentence typed at a key per 15 ms with xdotool, saved, checked), search (grep -w in %d MiB), compress (gzip and gunzip of %d MiB, compared), files (list and read %d files), scroll (%d lines in the terminal), %v idle after each. The workload times every action with bash's clock inside the session and sends it to the bench; a step's window is the interval after its user's workload started.",
			o.Interval, o.Size, o.BPP, o.Files.SearchBytes>>20, o.Files.CompressBytes>>20, o.Files.FolderFiles, o.Files.ScrollLines, o.Think),
		fmt.Sprintf("Degradation point: the first step after the %d baseline steps whose average action time passes the baseline (the average over the baseline steps' actions) + %.0f ms, or more than a tenth of whose actions failed, or whose user's logon failed. A ramp goes on %d step(s) past it.", o.BaselineSteps, o.AddMS, o.Beyond),
		fmt.Sprintf("%d measuring ramps, one after the other, every session ended between them. Headlines (degradation_users, limiting counter, per-session figures, charts) are the ramp with the median degradation point; degradation_users_worst is the ramp that degraded first, and the suggested session limit is one below it, since a limit must hold on the host's worst showing.", len(out.Ramps)),
		"Limiting counter: of the counters that went past their thresholds (table above) and stayed past them through the degradation point, the one that did so first; a single step past one (writeback, a burst of logons) does not count.",
		"CPU: machine_cpu_pct is every process, as a share of all cores (/proc/stat); client_cpu_pct the xfreerdp clients and their Xvfb; gateway_cpu_pct the gateway; host_cpu_pct the machine less clients, gateway, broker with agent, and the bench: the session host's own share. Memory per session is the average over sessions of the sum of Pss (/proc/PID/smaps_rollup) of the session's processes, as the agent reports it. Disk, memory pressure and CPU pressure as the agent reads them (/proc/diskstats, /proc/pressure/memory and /proc/pressure/cpu, some avg10 at the end of the window), paging from /proc/vmstat.",
		fmt.Sprintf("Broker ramp: once the host's CPU pressure has settled, the broker starts afresh with the delivery group's session_limit set to the suggested limit (one below the worst ramp's degradation point) or --session-limit, the host's agent reporting every second, and the broker's default health thresholds but a CPU pressure threshold of %.0f %%; users launch through POST /api/v1/launch and open the .rdp file with xfreerdp. It goes until the broker refuses or one user past the limit.", o.CPUPressureMaxPct),
		"The paper's servers ran Windows Server 2003 x64 with Office (Word, Excel, Outlook, Internet Explorer) per user on dedicated hardware with separate client machines; here the workload is lighter applications on xrdp and the clients share the machine, so per-core figures compare the method, not the software.",
	}
}

func stepPoint(scenario string, s Step) report.Point {
	m := map[string]float64{
		"logon_s": report.Round(s.LogonS, 1), "actions": float64(len(s.all())), "failed_actions": float64(s.failed()),
		"mean_ms": report.Round(s.Mean(), 1), "median_ms": report.Round(s.Percentile(50), 1), "p95_ms": report.Round(s.Percentile(95), 1),
		"machine_cpu_pct": report.Round(s.MachineCPUPct, 1), "host_cpu_pct": report.Round(s.HostCPUPct, 1), "client_cpu_pct": report.Round(s.ClientCPUPct, 1),
		"gateway_cpu_pct": report.Round(s.GatewayCPUPct, 1), "mem_used_pct": report.Round(s.MemUsedPct, 1), "mem_bytes_per_session": math.Round(s.MemPerSession),
		"disk_idle_pct": report.Round(s.DiskIdlePct, 1), "disk_latency_ms": report.Round(s.DiskLatencyMS, 1), "mem_pressure_pct": report.Round(s.MemPressurePct, 1), "cpu_pressure_pct": report.Round(s.CPUPressurePct, 1),
		"major_faults_per_s": report.Round(s.MajorFaultsPerS, 1), "swap_in_per_s": report.Round(s.SwapInPerS, 1), "swap_out_per_s": report.Round(s.SwapOutPerS, 1),
	}
	for a, ts := range s.Actions {
		m[a+"_median_ms"] = report.Round(percentile(ts, 50), 1)
	}
	for a, n := range s.Failed {
		m[a+"_failed"] = float64(n)
	}
	p := report.Point{Scenario: scenario, System: "deskway", Params: map[string]any{"users": s.Users}, Metrics: m}
	if s.LogonFailed != "" {
		p.Params["logon_failed"] = s.LogonFailed
	}
	return p
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.0f", v)
}

func stepTable(title string, steps []Step, broker bool) report.Table {
	t := report.Table{Title: title, Head: []string{"users", "logon s", "actions", "median ms", "p95 ms", "mean ms", "failed",
		"CPU machine %", "CPU pressure %", "host %", "clients %", "gateway %", "mem used %", "MiB/session", "disk idle %", "disk ms", "maj faults/s", "swap in/s"}}
	if broker {
		t.Head = append(t.Head, "placed")
	}
	for _, s := range steps {
		if s.LogonFailed != "" {
			row := []string{fmt.Sprint(s.Users), "failed: " + strings.ReplaceAll(s.LogonFailed, "|", "/")}
			for len(row) < len(t.Head) {
				row = append(row, "")
			}
			if broker {
				row[len(row)-1] = fmt.Sprint(s.Placed)
			}
			t.Rows = append(t.Rows, row)
			continue
		}
		row := []string{fmt.Sprint(s.Users), fmt.Sprintf("%.1f", s.LogonS), fmt.Sprint(len(s.all())), ms(s.Percentile(50)), ms(s.Percentile(95)), ms(s.Mean()), fmt.Sprint(s.failed()),
			fmt.Sprintf("%.0f", s.MachineCPUPct), fmt.Sprintf("%.0f", s.CPUPressurePct), fmt.Sprintf("%.0f", s.HostCPUPct), fmt.Sprintf("%.0f", s.ClientCPUPct), fmt.Sprintf("%.0f", s.GatewayCPUPct),
			fmt.Sprintf("%.0f", s.MemUsedPct), fmt.Sprintf("%.0f", s.MemPerSession/(1<<20)), fmt.Sprintf("%.0f", s.DiskIdlePct), fmt.Sprintf("%.1f", s.DiskLatencyMS),
			fmt.Sprintf("%.0f", s.MajorFaultsPerS), fmt.Sprintf("%.0f", s.SwapInPerS)}
		if broker {
			row = append(row, fmt.Sprint(s.Placed))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

func write(res *report.Result, out *Outcome, o Options) error {
	if err := res.WriteJSON(o.Out); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Session-host capacity\n\n`%s`, %s, %d CPUs, %.0f GiB.\n\n", res.Command, res.Started.Format("2006-01-02 15:04 UTC"), res.Machine.CPUs, float64(res.Machine.MemBytes)/(1<<30))
	deg := "not reached"
	if out.Degradation.Users > 0 {
		deg = fmt.Sprintf("**%d users** (%s)", out.Degradation.Users, out.Degradation.Why)
	}
	worst := "not reached"
	if w := out.Ramps[out.Worst].Degradation.Users; w > 0 {
		worst = fmt.Sprintf("**%d users**", w)
	}
	fmt.Fprintf(&b, "%d ramps. The median ramp: baseline %.0f ms; degradation point %s; limiting counter: **%s**. The worst ramp degraded at %s; suggested session limit: **%d**.\n\n",
		len(out.Ramps), out.Baseline, deg, out.Limiting, worst, out.SuggestLimit)
	if s, ok := atCapacity(out); ok {
		fmt.Fprintf(&b, "At %d users (the last step before it): %.0f MiB per session, the session host %.0f %% of the machine's CPU, the clients %.0f %%, the gateway %.0f %%.\n\n",
			s.Users, s.MemPerSession/(1<<20), s.HostCPUPct, s.ClientCPUPct, s.GatewayCPUPct)
	}
	if len(out.BrokerSteps) > 0 {
		fmt.Fprintf(&b, "Broker (session_limit %d): last placement at **%d users**", out.BrokerLimit, out.BrokerLast)
		if out.Degradation.Users > 0 {
			fmt.Fprintf(&b, ", %d below the median ramp's degradation point", out.Degradation.Users-out.BrokerLast)
		}
		if w := out.Ramps[out.Worst].Degradation.Users; w > 0 {
			fmt.Fprintf(&b, " and %d below the worst's", w-out.BrokerLast)
		}
		fmt.Fprintf(&b, "; the next launch: %s.\n\n", orNone(out.BrokerRefusal))
	}
	rt := report.Table{Title: "Measuring ramps", Head: []string{"ramp", "baseline (ms)", "degradation point (users)", "why", "limiting counter"}}
	for i, r := range out.Ramps {
		name := fmt.Sprint(i + 1)
		switch {
		case i == out.Median && i == out.Worst:
			name += " (median, worst)"
		case i == out.Median:
			name += " (median)"
		case i == out.Worst:
			name += " (worst)"
		}
		pt, why := "none", fmt.Sprintf("within %d users", len(r.Steps))
		if r.Degradation.Users > 0 {
			pt, why = fmt.Sprint(r.Degradation.Users), r.Degradation.Why
		}
		rt.Rows = append(rt.Rows, []string{name, fmt.Sprintf("%.0f", r.Baseline), pt, why, r.Limiting})
	}
	b.WriteString(rt.Markdown())
	b.WriteString(stepTable(fmt.Sprintf("Ramp %d through the gateway (the median)", out.Median+1), out.Steps, false).Markdown())
	ct := report.Table{Title: "Counters against their thresholds", Head: []string{"counter", "threshold", "past it for good from users", "value then", "steps past it"}}
	th := Thresholds(config.DefaultHealth())
	for i, c := range out.Crossings {
		at, v := "never", ""
		if c.Users > 0 {
			at, v = fmt.Sprint(c.Users), fmt.Sprintf("%.1f", c.Value)
		}
		ct.Rows = append(ct.Rows, []string{c.Counter, th[i].Limit, at, v, fmt.Sprint(c.StepsOver)})
	}
	b.WriteString(ct.Markdown())
	at := report.Table{Title: "Median time per action (ms) by step", Head: []string{"users"}}
	names := actionNames(out.Steps)
	at.Head = append(at.Head, names...)
	for _, s := range out.Steps {
		row := []string{fmt.Sprint(s.Users)}
		for _, n := range names {
			row = append(row, ms(percentile(s.Actions[n], 50)))
		}
		at.Rows = append(at.Rows, row)
	}
	b.WriteString(at.Markdown())
	pt := report.Table{Title: "Users per core: the paper's servers beside this one", Head: []string{"system", "server", "cores", "users", "users per core"}}
	for _, p := range res.Points {
		if p.Scenario == "capacity" {
			pt.Rows = append(pt.Rows, []string{p.System, fmt.Sprint(p.Params["server"]), fmt.Sprint(p.Params["cores"]), fmt.Sprintf("%.0f", p.Metrics["users"]), fmt.Sprintf("%.1f", p.Metrics["users_per_core"])})
		}
	}
	b.WriteString(pt.Markdown())
	if len(out.BrokerSteps) > 0 {
		b.WriteString(stepTable(fmt.Sprintf("Ramp through the broker (session_limit %d)", out.BrokerLimit), out.BrokerSteps, true).Markdown())
	}
	b.WriteString("## How it was measured\n\n")
	for _, n := range res.Notes {
		b.WriteString("- " + n + "\n")
	}
	b.WriteString("\n![action time](action-time.svg)\n![counters](counters.svg)\n![memory per session](memory.svg)\n")
	if err := os.WriteFile(filepath.Join(o.Out, "result.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return charts(out, o)
}

func orNone(s string) string {
	if s == "" {
		return "none refused"
	}
	return s
}

func actionNames(steps []Step) []string {
	seen := map[string]bool{}
	for _, s := range steps {
		for a := range s.Actions {
			seen[a] = true
		}
	}
	var out []string
	for a := range seen {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

func charts(out *Outcome, o Options) error {
	series := func(name string, steps []Step, f func(Step) float64) report.Series {
		s := report.Series{Name: name}
		for _, st := range steps {
			if st.LogonFailed != "" {
				continue
			}
			if v := f(st); !math.IsNaN(v) {
				s.X, s.Y = append(s.X, float64(st.Users)), append(s.Y, v)
			}
		}
		return s
	}
	var act []report.Series
	for i, r := range out.Ramps {
		act = append(act, series(fmt.Sprintf("mean, ramp %d", i+1), r.Steps, Step.Mean))
	}
	act = append(act, series("p95 (median ramp)", out.Steps, func(s Step) float64 { return s.Percentile(95) }))
	if len(out.BrokerSteps) > 0 {
		act = append(act, series("mean (broker ramp)", out.BrokerSteps, Step.Mean))
	}
	if err := report.LineChart(filepath.Join(o.Out, "action-time.svg"), "Action time against users (dashed: baseline + 1 s)", "users", "ms", act, out.Baseline+o.AddMS); err != nil {
		return err
	}
	if err := report.LineChart(filepath.Join(o.Out, "counters.svg"), "Counters against users", "users", "%", []report.Series{
		series("CPU, machine", out.Steps, func(s Step) float64 { return s.MachineCPUPct }),
		series("CPU, session host", out.Steps, func(s Step) float64 { return s.HostCPUPct }),
		series("CPU, clients", out.Steps, func(s Step) float64 { return s.ClientCPUPct }),
		series("memory used", out.Steps, func(s Step) float64 { return s.MemUsedPct }),
		series("disk idle", out.Steps, func(s Step) float64 { return s.DiskIdlePct }),
		series("CPU pressure", out.Steps, func(s Step) float64 { return s.CPUPressurePct }),
	}, 90); err != nil {
		return err
	}
	return report.LineChart(filepath.Join(o.Out, "memory.svg"), "Memory per session (Pss of its processes)", "users", "MiB", []report.Series{
		series("MiB per session", out.Steps, func(s Step) float64 { return s.MemPerSession / (1 << 20) }),
	}, 0)
}
