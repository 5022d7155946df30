package ttff

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// relay is the plain TCP hop deskway is held against.
const relay = "haproxy-tcp"

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func of(ss []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

func firstFrame(s sample) float64 { return s.firstFrame.Seconds() }
func waitCount(s sample) float64  { return float64(s.waits.count) }

// lessWaits is the first frame less what the client's busiest thread
// slept in 100 ms sleeps: the RDP sequence's races, lost alike through
// any hop and by chance, taken out of it.
func lessWaits(s sample) float64 { return (s.firstFrame - s.waits.mainThread).Seconds() }

// gatewayWork is the gateway's own working time to the channel open.
func gatewayWork(s sample) float64 { return (s.gw.http + s.gw.served).Seconds() }

// summarize sets, for every system, the median and worst first frame
// and 100 ms waits; for every deskway system what it adds over the
// plain TCP hop, in the median and in the worst run; and as headline
// ttff_added_s the largest of those (the slowest transport and
// authentication), never the best.
func summarize(res *report.Result, runs map[string][]sample) {
	s := res.Summary
	for _, sys := range systems() {
		ss := runs[sys.name]
		ff := of(ss, firstFrame)
		k := strings.ReplaceAll(sys.name, "-", "_")
		s[k+"_first_frame_s"] = report.Round(median(ff), 4)
		s[k+"_first_frame_s_worst"] = report.Round(slices.Max(ff), 4)
		w := of(ss, waitCount)
		s[k+"_waits_100ms"] = median(w)
		s[k+"_waits_100ms_worst"] = slices.Max(w)
		s[k+"_waits_10ms"] = median(of(ss, func(s sample) float64 { return float64(s.hsWaits.count) }))
		s[k+"_first_frame_less_waits_s"] = report.Round(median(of(ss, lessWaits)), 4)
	}
	base := of(runs[relay], firstFrame)
	direct := of(runs["direct"], firstFrame)
	s["relay_added_s"] = report.Round(median(base)-median(direct), 4)
	s["relay_added_s_worst"] = report.Round(slices.Max(base)-slices.Max(direct), 4)
	baseLess := median(of(runs[relay], lessWaits))
	added, worst, addedLess := -1e9, -1e9, -1e9
	for _, sys := range systems() {
		name, ok := strings.CutPrefix(sys.name, "deskway-")
		if !ok {
			continue
		}
		ff := of(runs[sys.name], firstFrame)
		k := strings.ReplaceAll(name, "-", "_")
		a, aw := median(ff)-median(base), slices.Max(ff)-slices.Max(base)
		s["ttff_added_s_"+k] = report.Round(a, 4)
		s["ttff_added_s_"+k+"_worst"] = report.Round(aw, 4)
		s["tunnel_open_s_"+k] = report.Round(median(of(runs[sys.name], func(s sample) float64 { return s.gw.open.Seconds() })), 4)
		s["gateway_work_s_"+k] = report.Round(median(of(runs[sys.name], gatewayWork)), 5)
		s["gateway_dial_s_"+k] = report.Round(median(of(runs[sys.name], func(s sample) float64 { return s.gw.dial.Seconds() })), 5)
		al := median(of(runs[sys.name], lessWaits)) - baseLess
		s["ttff_added_less_waits_s_"+k] = report.Round(al, 4)
		added, worst, addedLess = max(added, a), max(worst, aw), max(addedLess, al)
	}
	s["ttff_added_s"] = report.Round(added, 4)
	s["ttff_added_s_worst"] = report.Round(worst, 4)
	s["ttff_added_less_waits_s"] = report.Round(addedLess, 4)
}

func notes(runs int, loadBefore, loadAfter string) []string {
	return []string{
		fmt.Sprintf("Load average (1, 5, 15 min): %s before the runs, %s after. Whatever else ran on the machine shared its cores with every system alike: the systems take turns within each run.", loadBefore, loadAfter),
		fmt.Sprintf("One xrdp host (Debian's xrdp and xorgxrdp, its session an xterm with a navy background at +40+40), HAProxy in TCP mode (one thread) relaying to it, and one deskway gateway process offering NTLM (its own account) and PAA (a token from `deskway token`, minted before each connection); all on loopback. %d runs; each run connects every system once, the order turning by one each run; each connection reconnects to the one session a first, unmeasured, direct connection started.", runs),
		fmt.Sprintf("xfreerdp 2 on an Xvfb: `xfreerdp /v:HOST /u /p /cert:ignore /size:%dx%d` with, through the gateway, `/g /gt:http` (websocket) or `/gt:http,no-websockets` (RDG_IN_DATA and RDG_OUT_DATA) and `/gat:TOKEN` (PAA) or `/gu /gp` (NTLM). The first frame is the first poll (X GetImage of screen row 60, every 2 ms) that finds the navy xterm; the time runs from xfreerdp's execve (strace's timestamp) to that poll.", screenW, screenH),
		"Every connection runs under `strace -f -ttt -T --seccomp-bpf -e trace=" + traceCalls + "`: only these calls stop the client, not its polls and reads, which would hold back the read that races the reply. waits_100ms counts the client's 100 ms sleeps before the first frame: FreeRDP 2 sleeps 100 ms whenever its read right after sending a request finds no reply yet (seen with `--trace-io`, which traces reads, writes and polls too: sendto, recvfrom = EAGAIN, clock_nanosleep 100 ms). waits_10ms counts its 10 ms sleeps, the same in its gateway handshake. waited_s is the most any one thread lost to the 100 ms sleeps; tcp_connects the client's connections to the first hop.",
		"tunnel_open_s is the gateway's own log: from accepting the tunnel's first TCP connection (before TLS) to the channel open (its `tunnel open` line's open_ms). gateway_http_s and gateway_served_s are the same line's http_ms and served_ms, the gateway's own working time in it: answering the RDG HTTP requests (NTLM's rounds, the websocket upgrade or the legacy halves) from the handler's start to the response written, and the TSGU handshake from each request in hand to its reply written, the resource dial (gateway_dial_s, dial_ms) included. The rest of tunnel_open_s is the client's (its TLS, its sleeps) and the wake-ups between them.",
		"first_frame_less_waits_s is each connection's first frame less what its busiest thread slept in 100 ms sleeps, and ttff_added_less_waits_s_X deskway-X's median of it less haproxy-tcp's: the RDP sequence's races, lost by chance through any hop, taken out.",
		"ttff_added_s_X = median first frame of deskway-X − median of haproxy-tcp (the plain TCP hop), and _worst the worst run of each; the headline ttff_added_s is the largest over deskway's transports and authentications. relay_added_s is the plain hop over direct, for scale.",
	}
}

func write(res *report.Result, dir string) error {
	if err := res.WriteJSON(dir); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Time to first frame\n\n`%s`\n\nMeasured %s on %d CPUs, %.0f GiB, Linux %s, %s.\n\n", res.Command, res.Started.Format(time.RFC3339),
		res.Machine.CPUs, float64(res.Machine.MemBytes)/(1<<30), res.Machine.Kernel, res.Machine.Go)
	per := map[string][]report.Point{}
	for _, p := range res.Points {
		per[p.System] = append(per[p.System], p)
	}
	sum := report.Table{Head: []string{"System", "First frame, median (s)", "worst (s)", "best (s)", "over the TCP hop, median (worst) (s)",
		"100 ms waits per connection, median (min–max)", "lost to them, median (s)", "first frame less them, median (s)", "10 ms waits, median (max)", "gateway: connect to tunnel open, median (s)", "of which the gateway working, median (ms)"}}
	s := res.Summary
	for _, sys := range systems() {
		pts := per[sys.name]
		ff := metric(pts, "first_frame_s")
		w := metric(pts, "waits_100ms")
		k := strings.ReplaceAll(sys.name, "-", "_")
		over, open, work := "", "", ""
		if name, ok := strings.CutPrefix(sys.name, "deskway-"); ok {
			kk := strings.ReplaceAll(name, "-", "_")
			over = fmt.Sprintf("**%+.3f** (%+.3f)", s["ttff_added_s_"+kk], s["ttff_added_s_"+kk+"_worst"])
			open = fmt.Sprintf("%.3f", s["tunnel_open_s_"+kk])
			work = fmt.Sprintf("%.2f", s["gateway_work_s_"+kk]*1000)
		} else if sys.name == relay {
			over = fmt.Sprintf("(over direct %+.3f, worst %+.3f)", s["relay_added_s"], s["relay_added_s_worst"])
		}
		sum.Rows = append(sum.Rows, []string{sys.name, fmt.Sprintf("%.3f", s[k+"_first_frame_s"]), fmt.Sprintf("%.3f", s[k+"_first_frame_s_worst"]),
			fmt.Sprintf("%.3f", slices.Min(ff)), over, fmt.Sprintf("%g (%g–%g)", median(w), slices.Min(w), slices.Max(w)),
			fmt.Sprintf("%.2f", median(metric(pts, "waited_s"))), fmt.Sprintf("%.3f", s[k+"_first_frame_less_waits_s"]),
			fmt.Sprintf("%g (%g)", median(metric(pts, "waits_10ms")), slices.Max(metric(pts, "waits_10ms"))), open, work})
	}
	fmt.Fprintf(&b, "deskway over the plain TCP hop (`ttff_added_s`, its slowest transport and authentication): **%+.3f s** in the median, %+.3f s in the worst run; with each connection's 100 ms sleeps taken out (`ttff_added_less_waits_s`), %+.3f s.\n\n", s["ttff_added_s"], s["ttff_added_s_worst"], s["ttff_added_less_waits_s"])
	b.WriteString(sum.Markdown())
	runs := report.Table{Title: "Each connection, in the order they ran", Head: []string{"Run", "System", "First frame (s)", "100 ms waits", "threads waiting", "lost (s)", "10 ms waits", "TCP connects", "tunnel open (s)", "gateway working (ms)"}}
	for _, p := range res.Points {
		m := p.Metrics
		open, work := "", ""
		if v, ok := m["tunnel_open_s"]; ok {
			open = fmt.Sprintf("%.3f", v)
			work = fmt.Sprintf("%.2f", (m["gateway_http_s"]+m["gateway_served_s"])*1000)
		}
		runs.Rows = append(runs.Rows, []string{fmt.Sprint(p.Params["run"]), p.System, fmt.Sprintf("%.3f", m["first_frame_s"]), fmt.Sprintf("%.0f", m["waits_100ms"]),
			fmt.Sprintf("%.0f", m["wait_threads"]), fmt.Sprintf("%.2f", m["waited_s"]), fmt.Sprintf("%.0f", m["waits_10ms"]), fmt.Sprintf("%.0f", m["tcp_connects"]), open, work})
	}
	b.WriteString(runs.Markdown())
	b.WriteString("## How it was measured\n\n")
	for _, n := range res.Notes {
		b.WriteString("- " + n + "\n")
	}
	return os.WriteFile(filepath.Join(dir, "result.md"), []byte(b.String()), 0o644)
}

func metric(pts []report.Point, name string) []float64 {
	out := make([]float64, len(pts))
	for i, p := range pts {
		out[i] = p.Metrics[name]
	}
	return out
}
