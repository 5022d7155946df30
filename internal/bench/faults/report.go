package faults

import (
	"fmt"
	"sort"
	"strings"

	"github.com/deskway/deskway/internal/bench/report"
)

// lostKeys and wrongKeys are the metrics the table's "data lost" and
// "wrong answers" columns add up, over every run of a case.
var (
	lostKeys  = []string{"launches_lost", "writes_lost", "sessions_lost", "bytes_lost"}
	wrongKeys = []string{"launches_doubled", "wrong_disks", "bytes_wrong", "wrong_verdicts"}
)

// anchor is what a peer's public documentation promises for a fault.
type anchor struct {
	peer, promise, source string
}

// anchors are, per scenario, the peers' promises for the same fault,
// quoted from their documentation.
func anchors() map[string][]anchor {
	return map[string][]anchor{
		"broker": {
			{peer: "XenApp/XenDesktop 7.15 LTSR, Local Host Cache (database lost)",
				promise: "“Local Host Cache engages when the site database is inaccessible for 90 seconds.”",
				source:  "https://docs.citrix.com/en-us/xenapp-and-xendesktop/7-15-ltsr/manage-deployment/local-host-cache.html"},
			{peer: "Citrix DaaS, Local Host Cache (connection to the control plane lost)",
				promise: "“With Local Host Cache, users who are connected when an outage occurs can continue working uninterrupted. Reconnections and new connections experience minimal connection delays.”",
				source:  "https://docs.citrix.com/en-us/citrix-daas/manage-deployment/local-host-cache.html"},
		},
		"gateway": {
			{peer: "RD Gateway server farm",
				promise: "“RD Gateway does not perform load balancing itself.” (a load balancer in front is required; the help promises nothing for a member that dies)",
				source:  "Microsoft RD Gateway Manager help, “Create a Remote Desktop Gateway server farm” (copy at https://forsenergy.com/en-us/ts_gateway/html/c1acb922-d89a-4959-a436-5f844ad5acee.htm)"},
		},
		"stream": {
			{peer: "Citrix Provisioning (PVS) server failover",
				promise: "“When failover occurs, a target device does not experience any disruption in service or loss of data.”",
				source:  "https://docs.citrix.com/en-us/provisioning/current-release/advanced-concepts/managing-high-availability/ha-option-intro.html"},
		},
	}
}

// notes say how each scenario measures; each scenario's own lines.
func notes(scenarios []Scenario) []string {
	out := []string{
		"Every scenario runs the same number of times, interleaved (run 1 of each, then run 2, ...). Median and worst name their run; no figure is a best run.",
		"Users affected: users who saw an error, needed a second try or waited over a second. Time to recover: from the fault until the last affected user was served; \"none\" when nobody was affected.",
	}
	for _, s := range scenarios {
		if s.Name == "broker" {
			out = append(out,
				"broker: two `deskway broker` processes on one PostgreSQL (Debian's, on loopback), each with its own state directory (local host cache, journal). Simulated session hosts register and report through the same balancer as the users: their agent loop sends the events agent.Diff finds each 0.5 s and a heartbeat with their sessions each second; a session logs on 0.5 to 2 s after the user's client connects to the host the answer named.",
				"broker, how the client picks a broker: as the shipped deploy/haproxy/broker-farm.cfg does (round robin, no persistence, redispatch): each request goes to the next broker in turn; a broker that refuses the connection is skipped for the other at once. A launch whose connection breaks after it was sent (the broker died holding it) is tried again a quarter second later, as a portal or a user clicking again would, through the balancer, until answered or 60 s (40 s at small scale) have passed: then it counts as lost.",
				"broker, lost: a launch never answered, or answered with a host where, once every journal is written back and the agents have reported, the database has no live session of the user on that host or the host has none. Doubled: a user with two live sessions in the database, or a host holding more sessions than its limit. Both are read from the database after the run.",
				"broker, the killed broker stays dead to the end of the storm; PostgreSQL is stopped with `pg_ctl stop -m immediate` (open connections break, new ones are refused) and started again on the same port.",
			)
		}
		if s.Name == "gateway" {
			out = append(out,
				"gateway, node killed: a client is back at its first frame after the stall. The outcome's notes split that time in two for the clients that reconnected: from the fault to the client's RDP connection up again through the other node (FreeRDP loads its dynamic channels once the connection sequence through the gateway to the session host is done; the bench reads the client's log every 100 ms), and from there to the desktop back, which is the session host's part: xrdp hands each reconnection to xrdp-sesman, which authenticates the user and reattaches the session one at a time (its log shows them about half a second apart on this machine). Of the first part, the gateway's share is read from the surviving node's log: each tunnel it opened after the kill logs `open_ms`, from accepting the tunnel's first connection (before TLS) to its channel open, and within it `served_ms`, the node's own work (each of the tunnel's requests held until its reply was written, the dial to the host included); the rest of `open_ms` is the client's and the network's.",
			)
		}
		if s.Name == "link" {
			out = append(out,
				"link: the link is cut by a fault proxy of the bench's own on loopback between the two sides: while cut it reads nothing from either side and forwards nothing, so bytes wait in the senders' socket buffers as behind a firewall dropping every packet (no reset, no FIN reaches either side); when the link returns, what waited is delivered in order. (A connection opened during the cut is accepted and held, where a dropped SYN would not be; no case opens one then.)",
				"link, gateway ↔ session host: a real `deskway gateway` with `gateway.write_timeout` set short (5 s) in front of an echo host (a TCP server in the bench that sends every byte back, standing in for an RDP host: the gateway relays bytes and does not read them); clients are MS-TSGU websocket clients with PAA tokens, each sending a numbered byte pattern and checking every byte that comes back. Interactive: 512 B every 20 ms per tunnel, the link cut for twice the write timeout; recovered when every tunnel has an echo from after the link's return; bytes lost are those sent and never echoed once the writers stop. Bulk: every tunnel sends as fast as it can; the case waits for the gateway to end each tunnel (at most write timeout + 20 s), then restores the link and opens a new tunnel; detect is the time from the cut to the client's connection ending.",
				"link, broker ↔ PostgreSQL: the broker scenario's farm and storm (two brokers round robin, simulated session hosts), both brokers reaching PostgreSQL through the fault proxy, the link cut for as long as the broker scenario stops the database; lost and doubled are judged as there.",
			)
		}
		if s.Name == "link-stream" {
			out = append(out,
				"link-stream: a real `deskway stream` server (write caches in RAM, `stream.reconnect_window` 2m) behind the link scenario's fault proxy, and machines that each do what the kernel's NBD driver does with deskway-nbdroot: requests pipelined on one connection; a request unanswered for 15 s (the timeout deskway-nbdroot gives the kernel) ends the connection, and every request waiting is held and sent again on the connection negotiated anew with nbdroot.Connect, the function deskway-nbdroot reconnects with; an I/O error reaches the machine only when the server answers with one or no connection comes back within 5 minutes. Each of a machine's queue slots writes 64 KiB blocks naming the block and the write, and after each write reads back the block it wrote before, which must hold its last acknowledged write (a machine that reads anything else has a wrong disk); once the writers stop, every block is read back and compared with its last acknowledged write. The link is cut for 8 s (under the request timeout) and for 25 s (over it); recovered when every machine has had a request answered after the link returned. (No kernel NBD device here, so the kernel's part is played by the bench; a kernel would also drop the connection once its data went unacknowledged for 20 s, which a proxy that keeps accepting bytes does not provoke.)",
			)
		}
		if s.Name == "link-agent" {
			out = append(out,
				"link-agent: one real `deskway broker` (its database in SQLite on its own disk, `broker.heartbeat_timeout` 30s, hosts heartbeating every second) and three session hosts played by the broker scenario's simulated agents, which speak the agent's protocol and report as internal/agent does; one of them reaches the broker through the fault proxy. A user launches every 500 ms from 5 s before the cut to 5 s after the host is back, and the user's client connects to the host the answer names (directly: only the agent's link is cut). The host's status is read from the broker's admin API (`GET /api/v1/broker/hosts`) every 500 ms; stale is the time from the cut to the status `unreachable`, back the time from the link's return to `ok`. A launch placed on the cut host later than the heartbeat timeout and a second after the cut counts against the case. At the end every session the hosts hold must have its record, on its host, in `GET /api/v1/broker/sessions`.",
			)
		}
		if s.Name == "clock-jump" {
			out = append(out,
				"clock-jump: a real `deskway gateway` started with the hidden `--clock-offset-file` flag: it reads its token clock's offset from that file each time it reads the clock, and the bench rewrites the file (by a rename) to jump the clock 10 minutes ahead mid-run and, a few seconds later, to set it right. Open tunnels echo a checked byte pattern throughout; after the jump as many users as there are tunnels open one each with a fresh token. Held: every fresh token refused while the clock is off, every refusal in the gateway's log naming the clocks and NTP, every open tunnel still echoing 3 s after the jump with no byte lost or wrong, and a fresh tunnel opening once the clock is right (recover is from setting it right to that tunnel). The broker case: a real `deskway broker` (SQLite, one simulated session host whose address is the echo host) started with `--clock-offset-file`, in front of a real gateway keeping time with the broker's token key; users launch through the broker's launch API and open a tunnel with the token its answer carries. 10 users open tunnels before the step; the broker's clock steps 10 minutes back; 10 more launch and open one each; then the clock is set right and the next launch's tunnel is timed. Held: every token signed after the step refused with the clocks named, every tunnel opened before still echoing, the broker still showing its host `ok`, a tunnel opening once the clock is right. The offset moves only the broker's token clock, not the clock it judges heartbeats by.",
			)
		}
		if s.Name == "clock" {
			out = append(out,
				"clock: a real `deskway gateway` started with the hidden `--clock-offset` flag, which moves the clock its token checker reads (a Go binary reads the time through the vDSO, so nothing outside the process can move it); users present fresh tokens minted with `broker.token_ttl`'s default of 5 minutes by a correct clock, as the broker's launch answer carries them, and a tunnel that opens carries 64 KiB of echo. Held: outside the allowance every tunnel is refused and every refusal in the gateway's log names the clocks; within it every tunnel opens. A wrong verdict is a token accepted outside the allowance or refused within it.",
			)
		}
	}
	return out
}

func fmtS(v float64) string {
	if v <= 0 {
		return "none"
	}
	return fmt.Sprintf("%.1f s", v)
}

// fmtRecover is an outcome's time to recover: "not by itself" when users
// were affected and service did not come back while the case ran (a
// clock off until it is set right).
func fmtRecover(o Outcome) string {
	if o.RecoverS < 0 && o.Affected > 0 {
		return "not by itself"
	}
	return fmtS(o.RecoverS)
}

// markdown is result.md: the table of faults survived, the peers'
// promises beside it, and every run.
func markdown(res *report.Result, outcomes []Outcome, scenarios []Scenario, runs int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Faults survived\n\n`%s`, %s, %d CPUs, %s, Linux %s. %d runs of every scenario.\n\n",
		res.Command, res.Started.Format("2006-01-02 15:04 UTC"), res.Machine.CPUs, res.Machine.Go, res.Machine.Kernel, runs)
	order, byCase := caseRuns(outcomes)
	t := report.Table{Head: []string{"scenario", "load", "fault", "users", "users affected (median / worst)",
		"time to recover (median / worst)", "data lost (all runs)", "wrong answers (all runs)", "held"}}
	for _, k := range order {
		rs := byCase[k]
		o := rs[0]
		affMed, affWorst := medianWorst(rs, func(o Outcome) float64 { return float64(o.Affected) }, "max")
		recMed, recWorst := medianWorst(rs, func(o Outcome) float64 { return max(o.RecoverS, 0) }, "max")
		held := 0
		for _, r := range rs {
			if r.Held {
				held++
			}
		}
		heldS := fmt.Sprintf("yes, %d of %d runs", held, len(rs))
		if held < len(rs) {
			heldS = fmt.Sprintf("**no**: held in %d of %d runs", held, len(rs))
		}
		t.Rows = append(t.Rows, []string{o.Scenario, o.Load, o.Case, fmt.Sprint(o.Users),
			fmt.Sprintf("%d (run %d) / %d (run %d)", affMed.Affected, affMed.Run, affWorst.Affected, affWorst.Run),
			fmt.Sprintf("%s (run %d) / %s (run %d)", fmtRecover(recMed), recMed.Run, fmtRecover(recWorst), recWorst.Run),
			sums(rs, lostKeys), sums(rs, wrongKeys), heldS})
	}
	b.WriteString(t.Markdown())

	b.WriteString("## What the others promise for the same fault\n\nQuoted from their public documentation; none of them publishes measured figures for these faults.\n\n")
	at := report.Table{Head: []string{"scenario", "peer", "what its documentation says", "source"}}
	for _, s := range scenarios {
		for _, a := range anchors()[s.Name] {
			at.Rows = append(at.Rows, []string{s.Name, a.peer, a.promise, a.source})
		}
	}
	b.WriteString(at.Markdown())

	b.WriteString("## Headline figures\n\n")
	keys := make([]string, 0, len(res.Summary))
	for k := range res.Summary {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "- `%s`: %g\n", k, res.Summary[k])
	}
	b.WriteString("\n## Every run\n\n")
	for _, k := range order {
		rs := byCase[k]
		var names []string
		for name := range rs[0].Metrics {
			names = append(names, name)
		}
		sort.Strings(names)
		rt := report.Table{Title: rs[0].Scenario + ": " + rs[0].Case, Head: append([]string{"run", "users", "affected", "recover s", "held"}, names...)}
		for _, r := range rs {
			row := []string{fmt.Sprint(r.Run), fmt.Sprint(r.Users), fmt.Sprint(r.Affected), fmt.Sprintf("%.2f", r.RecoverS), fmt.Sprint(r.Held)}
			for _, n := range names {
				row = append(row, fmt.Sprintf("%g", report.Round(r.Metrics[n], 2)))
			}
			rt.Rows = append(rt.Rows, row)
		}
		b.WriteString(rt.Markdown())
		for _, r := range rs {
			fmt.Fprintf(&b, "- run %d: %s\n", r.Run, r.Notes)
		}
		b.WriteString("\n")
	}
	b.WriteString("## How it was measured\n\n")
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

// sums says the total of each of keys the case reports, over its runs.
func sums(rs []Outcome, keys []string) string {
	var parts []string
	for _, k := range keys {
		total, seen := 0.0, false
		for _, r := range rs {
			if v, ok := r.Metrics[k]; ok {
				total, seen = total+v, true
			}
		}
		if seen {
			parts = append(parts, fmt.Sprintf("%g %s", total, strings.ReplaceAll(k, "_", " ")))
		}
	}
	if len(parts) == 0 {
		return "not measured"
	}
	return strings.Join(parts, ", ")
}
