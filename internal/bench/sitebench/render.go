package sitebench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/deskway/deskway/internal/bench/report"
)

// names are the systems as result.md names them.
var names = map[string]string{
	sysGRE:    "deskway site, GRE (userspace datapath)",
	sysKernel: "deskway site, GRE (kernel datapath, tc eBPF)",
	sysWG:     "deskway site, WireGuard",
	sysWGGo:   "wireguard-go (its own program)",
	sysVXLAN:  "kernel VXLAN (ceiling)",
	sysDirect: "routed veths, no tunnel",
}

// write puts result.json, result.md and the chart in dir.
func write(res *report.Result, dir string, o Options) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := res.WriteJSON(dir); err != nil {
		return err
	}
	s := res.Summary
	has := func(k string) bool { _, ok := s[k]; return ok }
	var b strings.Builder
	fmt.Fprintf(&b, "# Site gateway throughput beside the RAS Gateway paper\n\n`%s`\n\nMeasured %s on %d CPUs, %d GiB, Linux %s, %s; %d runs of every system, %s counted after %s of ramp-up. %s.\n\n",
		res.Command, res.Started.Format("2006-01-02T15:04:05Z"), res.Machine.CPUs, res.Machine.MemBytes>>30, res.Machine.Kernel, res.Machine.Go,
		o.Runs, o.Window, o.Warmup, strings.Join(res.Notes, "; "))
	b.WriteString(report.Table{Title: "The paper's table, side by side (Gbit/s at the receiver; median run, worst run in brackets)",
		Head: []string{"system", "1 connection", "8 connections (paper: many)", "whole machine's cores per Gbit/s, 8 connections (median)"}, Rows: paperRows(res)}.Markdown())
	met := func(k string, target float64) [3]string {
		if !has(k) {
			return [3]string{"not measured", "–", "–"}
		}
		verdict := "met"
		if s[k] < target {
			verdict = "not met"
		}
		if s[k] >= target && s[k+"_worst"] < target {
			verdict += " (worst run: not met)"
		}
		return [3]string{fmt.Sprintf("%.2f", s[k]), fmt.Sprintf("%.2f", s[k+"_worst"]), verdict}
	}
	var rows [][]string
	add := func(what, k string, target float64) {
		m := met(k, target)
		rows = append(rows, []string{what, "`" + k + "`", m[0], m[1], m[2]})
	}
	for _, g := range []struct{ what, k string }{{"GRE (userspace)", "gre"}, {"GRE (kernel)", "grek"}} {
		add(g.what+" ≥ 1.5 × wireguard-go, 1 connection", g.k+"_single_ratio_wggo", targetGREOverWGGo)
		add(g.what+" ≥ 1.5 × wireguard-go, 8 connections", g.k+"_multi_ratio_wggo", targetGREOverWGGo)
		add(g.what+" ≥ 0.5 × the kernel's VXLAN, 8 connections", g.k+"_multi_ratio_vxlan", targetGREOverVXLAN)
		add(fmt.Sprintf("%s per core ≥ 5 × the paper's %.1f Gbit/s (whole machine's cores), 8 connections", g.what, paperMultiPerCore), g.k+"_gbps_per_core", targetPerCoreTimes*paperMultiPerCore)
		add(fmt.Sprintf("%s per core ≥ 5 × the paper's %.2f Gbit/s on one core (whole machine's cores), 1 connection", g.what, paperSinglePerCore), g.k+"_single_gbps_per_core", targetPerCoreTimes*paperSinglePerCore)
	}
	add("WireGuard mode ≥ 1.0 × wireguard-go, 1 connection", "wg_single_ratio_wggo", targetWGOverWGGo)
	add("WireGuard mode ≥ 1.0 × wireguard-go, 8 connections", "wg_multi_ratio_wggo", targetWGOverWGGo)
	rows = append(rows, failoverVerdict(s))
	b.WriteString(report.Table{Title: "Targets (ratios taken within each run)", Head: []string{"target", "summary key", "median run", "worst run", "verdict"}, Rows: rows}.Markdown())
	b.WriteString(report.Table{Title: "Failover: kill -9 of the active gateway, 8 TCP connections streaming office → desktop, a probe every 50 ms",
		Head: []string{"system", "seconds to the first probe answered through the passive", "connections reset or ended by an error", "connections whose bytes did not go on", "least any connection delivered after"}, Rows: failoverRows(res)}.Markdown())
	var info [][]string
	for _, k := range []string{"gre_single_ratio_vxlan", "gre_single_ratio_direct", "gre_multi_ratio_direct", "gre_gbps_per_gateway_core", "gre_single_gbps_per_gateway_core",
		"grek_single_ratio_vxlan", "grek_single_ratio_direct", "grek_multi_ratio_direct"} {
		if has(k) {
			info = append(info, []string{"`" + k + "`", fmt.Sprintf("%.2f", s[k]), fmt.Sprintf("%.2f", s[k+"_worst"])})
		}
	}
	b.WriteString(report.Table{Title: "For comparison, not targets", Head: []string{"figure", "median run", "worst run"}, Rows: info}.Markdown())
	var every [][]string
	for _, p := range res.Points {
		if p.Scenario != "throughput" || p.System == "paper" {
			continue
		}
		if p.Skipped != "" {
			every = append(every, []string{"–", p.System, "–", "skipped: " + p.Skipped, "", "", "", "", ""})
			continue
		}
		cell := func(k string) string {
			if v, ok := p.Metrics[k]; ok {
				return fmt.Sprintf("%.3f", v)
			}
			return "–"
		}
		every = append(every, []string{fmt.Sprint(p.Params["run"]), p.System, fmt.Sprint(p.Params["connections"]), cell("gbps"), cell("slowest_connection_gbps"),
			cell("retransmitted_pct"), cell("machine_cores"), cell("machine_cores_per_gbps"), cell("gateway_cores_per_gbps")})
	}
	b.WriteString(report.Table{Title: "Every measurement", Head: []string{"run", "system", "connections", "Gbit/s", "slowest connection, Gbit/s", "TCP segments sent again, %", "machine's busy cores", "machine's cores per Gbit/s", "gateway process's cores per Gbit/s"}, Rows: every}.Markdown())
	fmt.Fprintf(&b, `![Throughput, median run](throughput.svg)

## How it was measured

- Each system runs in five network namespaces of its own, made with a random suffix and deleted after it (also when the bench fails): the office's LAN (the sender, 192.168.1.10), the office's router, the gateway, the tenant's compartment and the hosted desktop (the receiver, 10.0.0.10). The router and the gateway share an underlay veth (198.51.100.0/24), both of whose ends receive as a NIC does, for every system alike: they coalesce what they receive (GRO, on by default in NICs; on a veth with rx-udp-gro-forwarding too, without which a veth leaves a socket's packets out of GRO) in a NAPI thread of their own (a veth otherwise receives inside the sender's system call, one packet at a time, with nothing to coalesce), behind a queue (pfifo_fast, the kernel's default for NICs; a veth has none and drops what its peer's ring cannot take); the compartment reaches the desktop over a veth.
- **deskway site, GRE** and **WireGuard**: deskway site is both the gateway and the office's router (this kernel has no ip_gre), its tenants' namespaces being the LAN and the compartment; GRE with the tenant's key, MTU 1400 (the default); WireGuard with one site each way, MTU 1420 (the default). GRE runs twice: with `+"`datapath: userspace`"+` (TUN devices, raw and packet sockets) and with `+"`datapath: kernel`"+` (deskway's tc programs on a veth into each tenant's namespace and on the underlay; the kernel segments each superpacket once). The failover runs with the default datapath, the kernel's where it takes the programs.
- **wireguard-go**: its own program (version %s, the module proxy's latest, built with go install), one at each end, started in the router's and the gateway's namespaces (their UDP sockets there) with their TUN devices moved into the LAN and the compartment, as deskway places its own; configured over its configuration socket; MTU 1420.
- **kernel VXLAN**: a VXLAN device at each end, made on the underlay and moved into the LAN and the compartment (MTU 1450): the in-kernel tunnel this kernel has, the ceiling for encapsulation.
- **routed veths**: the same namespaces joined by veths and routed, no tunnel: what the machine does with no encapsulation at all.
- The throughput tool is the bench's own Go sender and receiver (in the bench's process, their sockets in the LAN and the desktop namespaces), as `+"`deskway bench throughput`"+` has its own: 1 or 8 TCP connections each writing 256 KiB buffers as fast as they go; bytes are counted at the receiver over the window, after a ramp-up that is not counted. A tool of our own rather than iperf3: Debian 12's iperf3 (3.12) runs every stream of a test on one thread, which would make the 8-connection figure the tool's limit on a 2-core machine, and counting at the receiver in the bench's process needs no output parsing.
- Systems take turns: each run goes through every system, the order turning by one each run; a ratio is taken within a run, and the summary gives its median and worst run.
- CPU: the whole machine's busy time from /proc/stat (everything but idle and iowait) over the window, for every system alike. The kernel's paths (VXLAN, routed veths) forward in softirq, which belongs to no process, so a per-process figure would not compare; the machine's figure counts the sender, the receiver, both tunnel ends and the kernel's forwarding, all on this machine's %d cores, and so overstates what a gateway alone uses. The gateway process's own CPU (per-thread scheduler time) is given beside it for the userspace gateways; it misses the kernel's work done for it in softirq, and counts work the kernel does in its system calls for the next hop.
- The paper's gateway was a 10-vCPU VM at 100 %% with many connections (2.0 Gbit/s: 0.2 Gbit/s per core) and one core full with one connection (0.4–0.5 Gbit/s); its figures are the `+"`paper`"+` points.
- **Failover**, taking its turn among the systems in every run: PostgreSQL (started by the bench, on loopback) holds the pair's lease (`+haLease+`); two deskway site gateways over GRE, each in an underlay namespace of its own on a bridge with the office's router and a tenant's namespace on a bridge with the desktop; the active holds the endpoint address 198.51.100.1 and the inside address 10.0.0.1. Eight TCP connections stream from the office's host to the desktop (32 KiB every 20 ms each) and the office's host sends an ICMP echo request to the desktop every 50 ms; the active gateway is killed with SIGKILL. The failover time is from the kill to the answer to the first request sent after the killed process had ended (until then its kernel programs still forward), which came through the passive. A connection counts as lost (`+"`failover_conns_reset`"+`, the worst run's) if its sender or the receiver got a reset or any other error, or if the receiver got none of its bytes within twice the outage (10 s at least) after the first answer: TCP resends on a backoff that doubles while the path is down.
- Other people's builds and tests share this machine; the load averages above say how busy it was.
`, res.SummaryText["wireguard_go_version"], res.Machine.CPUs)
	if err := os.WriteFile(filepath.Join(dir, "result.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return chart(res, dir)
}

// paperRows is the side-by-side table: the paper's row, then each
// system's median and worst run.
func paperRows(res *report.Result) [][]string {
	s := res.Summary
	rows := [][]string{{"RAS Gateway (paper, 10 vCPUs)", fmt.Sprintf("%.1f–%.1f (one core full)", paperSingleGbpsLow, paperSingleGbpsHigh), fmt.Sprintf("%.1f (10 cores full)", paperMultiGbps), "5 (10 cores ÷ 2.0)"}}
	for _, sys := range Systems {
		cell := func(l string) string {
			k := short[sys] + "_" + l + "_gbps"
			if _, ok := s[k]; !ok {
				return "–"
			}
			return fmt.Sprintf("%.2f (%.2f)", s[k], s[k+"_worst"])
		}
		rows = append(rows, []string{names[sys], cell("single"), cell("multi"), coresPerGbps(res, sys)})
	}
	return rows
}

// coresPerGbps is the median of a system's 8-connection points' machine
// cores per Gbit/s.
func coresPerGbps(res *report.Result, sys string) string {
	var vs []float64
	for _, p := range res.Points {
		if p.System == sys && p.Params["connections"] == 8 {
			if v, ok := p.Metrics["machine_cores_per_gbps"]; ok {
				vs = append(vs, v)
			}
		}
	}
	if len(vs) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", median(vs))
}

// chart draws the median runs' throughput beside the paper's.
func chart(res *report.Result, dir string) error {
	s := res.Summary
	series := []report.Series{{Name: "paper (RAS Gateway)", Y: []float64{paperSinglePerCore, paperMultiGbps}}}
	for _, sys := range Systems {
		if _, ok := s[short[sys]+"_single_gbps"]; !ok {
			continue
		}
		series = append(series, report.Series{Name: sys, Y: []float64{s[short[sys]+"_single_gbps"], s[short[sys]+"_multi_gbps"]}})
	}
	return report.BarChart(filepath.Join(dir, "throughput.svg"), "TCP throughput office → desktop (median run)", "Gbit/s",
		[]string{"1 connection", "8 connections (paper: many)"}, series)
}
