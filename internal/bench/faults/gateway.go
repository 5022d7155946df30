package faults

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// Timings of the gateway scenario. A client whose screen goes without a
// frame for over stallLimit noticed (its desktop repaints every quarter
// of a second); the target is every such client back within backTarget;
// a client not back within giveUp is lost.
const (
	stallLimit   = time.Second
	backTarget   = 10 * time.Second
	giveUp       = 60 * time.Second
	logonTimeout = 2 * time.Minute
	// drainWindow is how long a drained node's clients are watched.
	drainWindow = 10 * time.Second
	// logonBatch is how many clients log on at once.
	logonBatch = 4
)

// Gateway is the scenario of a gateway node dying: two nodes of a farm
// behind round-robin HAProxy carry xfreerdp clients, half on the
// websocket transport and half on the legacy RDG HTTP one, each in an
// xrdp desktop that repaints four times a second. One node is killed
// with SIGKILL; later the other is drained on HAProxy's stats socket
// and, drained, stopped with SIGTERM. Each client is watched for the
// frames its screen shows, and afterwards its xrdp session is compared
// with the one it had: a client that comes back by itself (FreeRDP's
// auto-reconnect, which the broker's .rdp file turns on) to its own
// session lost nothing.
func Gateway() Scenario {
	return Scenario{Name: "gateway", Run: runGateway}
}

// clientResult is what one client went through in one fault.
type clientResult struct {
	// affected: a stall over stallLimit, or a reconnect attempt.
	affected bool
	// back: frames again after the stall, from the same xfreerdp.
	back bool
	// backAfter runs from the fault to the first frame after the stall;
	// stall is the stall's own length.
	backAfter, stall time.Duration
	// connectedAfter runs from the fault to when the client's log first
	// showed its RDP connection up again after a reconnect attempt (read
	// every 100 ms): the part the gateway farm and the client own. The
	// rest, to backAfter, is the session host logging the user back on
	// and drawing the desktop.
	connectedAfter time.Duration
	reconnects     int
	sameSession    bool
	// froze: not back, though its RDP connection was up again through
	// the farm, to its own xrdp session, and the farm was relaying that
	// session's updates to it when the wait ended. The client read them
	// and drew none (xfreerdp 2.11 does this when starved of CPU; see
	// docs/benchmarks/faults/README.md): its user sees a frozen screen,
	// so it counts as lost, and apart as the client's.
	froze bool
}

func runGateway(ctx context.Context, env Env, run int) ([]Outcome, error) {
	n := 20
	if env.Small {
		n = 4
	}
	if env.HoldXRDP != nil {
		release, err := env.HoldXRDP(ctx)
		if err != nil {
			return nil, err
		}
		// Deferred first, so it runs after r.close has stopped xrdp.
		defer release()
	}
	r := &gwRig{env: env, dir: filepath.Join(env.Work, fmt.Sprintf("gateway-%d", run))}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, err
	}
	defer r.close()
	if err := r.setUp(n); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := 0; i < n; i += logonBatch {
		type got struct {
			c   *gwClient
			err error
		}
		ch := make(chan got)
		batch := min(logonBatch, n-i)
		for j := i; j < i+batch; j++ {
			go func() {
				c, err := r.connect(wctx, j, logonTimeout)
				ch <- got{c, err}
			}()
		}
		var errs []string
		for range batch {
			g := <-ch
			if g.err != nil {
				errs = append(errs, g.err.Error())
				continue
			}
			r.clients = append(r.clients, g.c)
		}
		if len(errs) > 0 {
			return nil, fmt.Errorf("faults: logging the clients on: %s", strings.Join(errs, "; "))
		}
	}
	env.Log.Info("gateway scenario: every client shows its desktop", "run", run, "clients", n)
	before, err := r.sessions()
	if err != nil {
		return nil, err
	}
	for _, u := range r.users {
		if len(before[u]) != 1 {
			return nil, fmt.Errorf("faults: %s has %d xrdp sessions after logging on, want 1: %v", u, len(before[u]), before[u])
		}
	}
	load := fmt.Sprintf("%d xfreerdp clients (%d websocket, %d legacy RDG HTTP) through 2 gateway nodes behind round-robin HAProxy, each in an xrdp desktop repainting 4 times a second",
		n, (n+1)/2, n/2)
	base := Outcome{Scenario: "gateway", Run: run, Load: load, Users: n}
	var outs []Outcome

	// A window without a fault: the stalls a loaded machine causes by
	// itself, to read the cases' against.
	m := r.mark()
	t0 := time.Now()
	res := r.observe(ctx, t0, m, drainWindow, before)
	o := r.outcome(base, "none (control window)", res, 0)
	o.Held = o.Metrics["sessions_lost"] == 0 && o.Metrics["reconnect_attempts"] == 0
	outs = append(outs, o)
	env.Log.Info("gateway scenario: control window", "run", run, "stalled", o.Metrics["stalled_over_1s"])

	// Kill -9 one node.
	on, err := r.tunnelsOn(ctx, 0)
	if err != nil {
		return nil, err
	}
	m = r.mark()
	survivorLog := len(r.nodes[1].proc.Output())
	t0 = time.Now()
	_ = syscall.Kill(r.nodes[0].proc.Pid(), syscall.SIGKILL)
	<-r.nodes[0].proc.Exited()
	res = r.observe(ctx, t0, m, 5*time.Second, before)
	o = r.outcome(base, "kill -9 one node", res, len(on))
	addOpenShares(&o, openShares(r.nodes[1].proc.Output(), survivorLog))
	o.Held = o.Metrics["sessions_lost"] == 0 && o.Metrics["back_within_10s_pct"] >= 95
	outs = append(outs, o)
	env.Log.Info("gateway scenario: node killed", "run", run, "affected", o.Affected, "lost", o.Metrics["sessions_lost"], "worst_s", o.RecoverS)

	// The killed node comes back; every client is now on the other one,
	// those that were lost started again by hand.
	if err := r.startNode(0); err != nil {
		return outs, err
	}
	if err := r.waitServer("gw1", "UP", 20*time.Second); err != nil {
		return outs, err
	}
	if err := r.restartLost(wctx); err != nil {
		return outs, err
	}

	// Drain the node that carries the clients: nobody should notice.
	on, err = r.tunnelsOn(ctx, 1)
	if err != nil {
		return outs, err
	}
	if _, err := r.haproxy("set server gateways/gw2 state drain"); err != nil {
		return outs, err
	}
	if err := r.waitServer("gw2", "DRAIN", 5*time.Second); err != nil {
		return outs, err
	}
	m = r.mark()
	t0 = time.Now()
	res = r.observe(ctx, t0, m, drainWindow, before)
	o = r.outcome(base, "drain one node (HAProxy)", res, len(on))
	// Nobody reconnected or was lost; stalls are read against the
	// control window's.
	o.Held = o.Metrics["reconnect_attempts"] == 0 && o.Metrics["sessions_lost"] == 0
	outs = append(outs, o)
	env.Log.Info("gateway scenario: node drained", "run", run, "affected", o.Affected)

	if err := r.restartLost(wctx); err != nil {
		return outs, err
	}
	// Stop the drained node as systemctl stop does: its tunnels run for
	// shutdown_grace, then end, and their clients reconnect.
	m = r.mark()
	t0 = time.Now()
	_ = syscall.Kill(r.nodes[1].proc.Pid(), syscall.SIGTERM)
	res = r.observe(ctx, t0, m, 5*time.Second+2*stallLimit, before)
	o = r.outcome(base, "stop a drained node (SIGTERM, shutdown_grace 5 s)", res, len(on))
	o.Held = o.Metrics["sessions_lost"] == 0
	outs = append(outs, o)
	env.Log.Info("gateway scenario: drained node stopped", "run", run, "affected", o.Affected, "lost", o.Metrics["sessions_lost"])
	return outs, nil
}

// restartLost starts again, as their users would, the clients whose
// xfreerdp ended, so that every case starts with every client working.
func (r *gwRig) restartLost(ctx context.Context) error {
	for _, c := range r.clients {
		if c.exited() {
			r.env.Log.Info("gateway scenario: starting a lost client again", "user", c.user)
			if _, err := r.launch(c.user); err != nil {
				return err
			}
			if err := c.start(ctx, logonTimeout); err != nil {
				return err
			}
		}
	}
	return nil
}

// clientMark is where a client's log stood before a fault: its count of
// reconnect attempts and its length.
type clientMark struct{ reconnects, logLen int }

// mark is each client's mark, taken before a fault: xfreerdp starts its
// first reconnect attempt within milliseconds of the fault.
func (r *gwRig) mark() []clientMark {
	m := make([]clientMark, len(r.clients))
	for i, c := range r.clients {
		m[i] = clientMark{c.reconnects(), len(c.proc.Output())}
	}
	return m
}

// observe watches every client from the fault at t0 for at least min,
// until each is back or plainly unaffected, or giveUp has passed, then
// compares each user's xrdp sessions with before; start is mark's from
// before the fault.
func (r *gwRig) observe(ctx context.Context, t0 time.Time, start []clientMark, min time.Duration, before map[string][]string) []clientResult {
	res := make([]clientResult, len(r.clients))
	connected := make([]time.Duration, len(r.clients))
	for {
		now := time.Now()
		settled := true
		for i, c := range r.clients {
			if connected[i] == 0 && reconnectedIn(c.proc.Output(), start[i].logLen) {
				connected[i] = now.Sub(t0)
			}
			res[i] = c.judge(t0, now)
			res[i].connectedAfter = connected[i]
			res[i].reconnects = c.reconnects() - start[i].reconnects
			if res[i].reconnects > 0 {
				res[i].affected = true
			}
			if c.exited() {
				// Gone, whatever its last frames were: its user must start
				// it again.
				res[i].affected, res[i].back = true, false
				continue
			}
			if !res[i].back && (res[i].affected || now.Sub(t0) < min) {
				settled = false
			}
		}
		if settled || now.Sub(t0) > giveUp || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	after, err := r.sessions()
	var lost []string
	for i, c := range r.clients {
		if res[i].affected && !res[i].back {
			lost = append(lost, c.user)
		}
	}
	var relay map[string]string
	var carrying map[string]bool
	if len(lost) > 0 {
		relay, carrying = r.relayed(ctx, lost)
	}
	for i, c := range r.clients {
		res[i].sameSession = err == nil && slices.Equal(before[c.user], after[c.user])
		res[i].froze = res[i].affected && !res[i].back && res[i].sameSession && connected[i] > 0 && carrying[c.user] && !c.exited()
		if !res[i].sameSession {
			r.env.Log.Warn("gateway scenario: a user's xrdp session changed", "user", c.user, "before", before[c.user], "after", after[c.user], "err", err)
		}
		if res[i].affected && !res[i].back {
			shot := filepath.Join(r.dir, fmt.Sprintf("lost-%s-%d.png", c.user, t0.Unix()))
			if err := c.shot(shot); err != nil {
				shot = err.Error()
			}
			r.env.Log.Warn("gateway scenario: a client did not come back", "user", c.user, "transport", c.transport, "froze", res[i].froze, "sampled", c.sampled(), "xfreerdp", c.proc.Tail(12),
				"gateway_refusals", r.refusals(c.user), "relay", relay[c.user], "screen", shot)
		}
	}
	return res
}

// judge says what the client went through from t0 until now: its
// longest gap between frames (counting from its last frame before t0),
// if over stallLimit, is its stall, and the frame that ended it its
// return. The longest, not the first: on a loaded machine a client may
// stall for a second on its own before or after the fault's stall.
func (c *gwClient) judge(t0, now time.Time) clientResult {
	prev, after := c.framesSince(t0)
	if prev.IsZero() {
		prev = t0
	}
	var longest time.Duration
	var end time.Time
	for _, f := range after {
		if g := f.Sub(prev); g > longest {
			longest, end = g, f
		}
		prev = f
	}
	if open := now.Sub(prev); open > stallLimit && open >= longest {
		return clientResult{affected: true, stall: open}
	}
	if longest > stallLimit {
		return clientResult{affected: true, back: true, backAfter: end.Sub(t0), stall: longest}
	}
	return clientResult{}
}

// outcome sums the clients' results for one fault case; onNode is how
// many had their tunnel on the node the fault struck.
func (r *gwRig) outcome(o Outcome, name string, res []clientResult, onNode int) Outcome {
	o.Case = name
	var backs, stalls, connects, hostParts []float64
	lost, froze, back, reconnected, within, attempts, stalled := 0, 0, 0, 0, 0, 0, 0
	for _, cr := range res {
		if cr.froze {
			froze++
		}
		attempts += cr.reconnects
		if cr.affected {
			o.Affected++
		}
		if cr.stall > stallLimit {
			stalled++
		}
		if !cr.sameSession || (cr.affected && !cr.back) {
			lost++
			continue
		}
		if cr.affected && cr.reconnects > 0 {
			reconnected++
		}
		if cr.affected {
			back++
			stalls = append(stalls, cr.stall.Seconds())
			backs = append(backs, cr.backAfter.Seconds())
			if cr.connectedAfter > 0 {
				connects = append(connects, cr.connectedAfter.Seconds())
				hostParts = append(hostParts, (cr.backAfter - cr.connectedAfter).Seconds())
			}
			if cr.backAfter <= backTarget {
				within++
			}
		}
	}
	pct := 100.0
	if o.Affected > 0 {
		pct = 100 * float64(within) / float64(o.Affected)
	}
	o.Metrics = map[string]float64{
		"cpus":                float64(runtime.NumCPU()),
		"clients_on_node":     float64(onNode),
		"stalled_over_1s":     float64(stalled),
		"reconnect_attempts":  float64(attempts),
		"back_same_session":   float64(back),
		"reconnected":         float64(reconnected),
		"back_within_10s_pct": round2(pct),
		"sessions_lost":       float64(lost),
		"clients_froze":       float64(froze),
	}
	o.RecoverS = -1
	if f := strings.Fields(report.LoadAverage()); len(f) == 3 {
		load, _ := strconv.ParseFloat(f[0], 64)
		o.Metrics["machine_load_1m"] = load
	}
	if len(backs) > 0 {
		slices.Sort(backs)
		o.Metrics["back_median_s"] = round2(backs[len(backs)/2])
		o.Metrics["back_worst_s"] = round2(backs[len(backs)-1])
		o.RecoverS = round2(backs[len(backs)-1])
		slices.Sort(stalls)
		o.Metrics["stall_median_s"] = round2(stalls[len(stalls)/2])
		o.Metrics["stall_worst_s"] = round2(stalls[len(stalls)-1])
	}
	// Of those that came back by reconnecting: the fault to the RDP
	// connection up again through the other node, and from there to the
	// desktop back (the session host's part).
	if len(connects) > 0 {
		slices.Sort(connects)
		slices.Sort(hostParts)
		o.Metrics["connected_median_s"] = round2(connects[len(connects)/2])
		o.Metrics["connected_worst_s"] = round2(connects[len(connects)-1])
		o.Metrics["connected_within_10s_pct"] = round2(100 * float64(countAtMost(connects, backTarget.Seconds())) / float64(len(connects)))
		o.Metrics["host_part_median_s"] = round2(hostParts[len(hostParts)/2])
		o.Metrics["host_part_worst_s"] = round2(hostParts[len(hostParts)-1])
	}
	if lost > 0 {
		o.RecoverS = giveUp.Seconds()
	}
	o.Notes = fmt.Sprintf("%d of %d clients had their tunnel on the node; %d noticed (a stall over 1 s or a reconnect: %d stalled, %d reconnect attempts); %d came back by themselves to their own xrdp session, %d of them by reconnecting; %d were lost.",
		onNode, len(res), o.Affected, stalled, attempts, back, reconnected, lost)
	if froze > 0 {
		o.Notes += fmt.Sprintf(" %d of the lost came back through the farm to their own session, which the farm was still relaying to them, but their screens stayed frozen: the client read the session's updates and drew none.", froze)
	}
	if len(connects) > 0 {
		o.Notes += fmt.Sprintf(" Their RDP connections were up again through the farm %.1f s after the fault (median; worst %.1f s); the session host then took %.1f s (median; worst %.1f s) to log them back on to their desktops.",
			o.Metrics["connected_median_s"], o.Metrics["connected_worst_s"], o.Metrics["host_part_median_s"], o.Metrics["host_part_worst_s"])
	}
	return o
}

// addOpenShares adds to o the gateway's share of the reconnections: the
// open_ms of the tunnels the surviving node opened after the kill, and
// the served_ms within it that was the node's own work.
func addOpenShares(o *Outcome, sh tunnelShares) {
	if len(sh.open) == 0 {
		return
	}
	open, served := slices.Sorted(slices.Values(sh.open)), slices.Sorted(slices.Values(sh.served))
	o.Metrics["gateway_tunnels_opened"] = float64(len(open))
	o.Metrics["gateway_open_ms_median"] = round2(open[len(open)/2])
	o.Metrics["gateway_open_ms_worst"] = round2(open[len(open)-1])
	o.Metrics["gateway_served_ms_median"] = round2(served[len(served)/2])
	o.Metrics["gateway_served_ms_worst"] = round2(served[len(served)-1])
	o.Notes += fmt.Sprintf(" The surviving node opened %d tunnels after the kill: from accepting each tunnel's first connection to its channel open took %.0f ms in the median, %.0f ms at worst, of which the node's own work (each request held until its reply was written, the dial to the host included; the rest is the client's and the network's) was %.0f ms in the median, %.0f ms at worst.",
		len(open), o.Metrics["gateway_open_ms_median"], o.Metrics["gateway_open_ms_worst"], o.Metrics["gateway_served_ms_median"], o.Metrics["gateway_served_ms_worst"])
}

// countAtMost counts the values of sorted vs at most limit.
func countAtMost(vs []float64, limit float64) int {
	n, _ := slices.BinarySearch(vs, math.Nextafter(limit, math.Inf(1)))
	return n
}

func round2(v float64) float64 { return float64(int(v*100+0.5)) / 100 }
