// Package sessionhost is `deskway bench sessionhost`: how many users one
// session host holds before they feel it, measured as the Terminal
// Server paper did. Simulated knowledge workers log on one by one, each
// through the gateway with a real xfreerdp, and run a scripted workload
// inside their xrdp desktop that times its own actions; the degradation
// point is the user count where the average action time passes the
// first users' average plus a second (Login VSI's VSImax rule), or a
// logon fails. A second ramp sends the launches through the broker with
// the host's agent reporting, and shows where the broker stops placing.
package sessionhost

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/deskway/deskway/internal/agent"
	"github.com/deskway/deskway/internal/bench/procstat"
	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/config"
)

// FileSizes are the workload's documents, per user.
type FileSizes struct {
	SearchBytes   int // the large file searched
	CompressBytes int // the document compressed and unpacked
	ScrollLines   int // the document scrolled in the terminal
	FolderFiles   int // files listed and opened, 16 KiB each
}

// Options configure a run.
type Options struct {
	Out, Command string
	Log          *slog.Logger
	// Users is the most users a ramp logs on.
	Users int
	// Interval is the time between logons: each step's measuring window.
	Interval time.Duration
	// Think is the idle time after each action.
	Think time.Duration
	// BaselineSteps are the first steps whose actions make the baseline.
	BaselineSteps int
	// AddMS is how far above the baseline the average action time may
	// go before the host counts as degraded.
	AddMS float64
	// Beyond is how many steps a ramp goes on past the degradation point,
	// to show the curve past it.
	Beyond int
	// Ramps is how many measuring ramps run, one after the other: the
	// degradation point moves from ramp to ramp on a shared machine, and
	// a session limit must hold for the ramp that degraded first.
	Ramps int
	// SuggestOnly suggests a session limit from the measuring ramps and
	// runs the broker ramp only to check a SessionLimit given with it.
	SuggestOnly bool
	// SessionLimit, when set, is the broker ramp's session limit in place
	// of the suggested one: to check a limit an administrator chose.
	SessionLimit int
	// CPUPressureMaxPct is the broker's CPU pressure threshold
	// (broker.health.cpu_pressure_max_pct): 0 for its default.
	CPUPressureMaxPct float64
	// CalmWait is the longest the bench waits, before each ramp but the
	// first, for the host's CPU pressure to settle: 0 for calmWait, a
	// negative value not to wait (a smoke run on a machine busy with
	// other work, which checks the plumbing, not the figures).
	CalmWait time.Duration
	// LogonTimeout is how long a logon may take before it counts as failed.
	LogonTimeout time.Duration
	// Size and BPP are the clients' desktops: small and few colours, so
	// that the clients, on the same machine, cost the host little.
	Size  string
	BPP   int
	Files FileSizes
}

func (o *Options) defaults() {
	if o.Users <= 0 {
		o.Users = 24
	}
	if o.Ramps <= 0 {
		o.Ramps = 3
	}
	if o.CPUPressureMaxPct <= 0 {
		o.CPUPressureMaxPct = config.DefaultHealth().CPUPressureMaxPct
	}
	if o.CalmWait == 0 {
		o.CalmWait = calmWait
	}
	if o.Interval <= 0 {
		o.Interval = 20 * time.Second
	}
	if o.Think <= 0 {
		o.Think = time.Second
	}
	if o.BaselineSteps <= 0 {
		o.BaselineSteps = 2
	}
	if o.AddMS <= 0 {
		o.AddMS = 1000
	}
	if o.LogonTimeout <= 0 {
		o.LogonTimeout = 90 * time.Second
	}
	if o.Size == "" {
		o.Size = "800x600"
	}
	if o.BPP == 0 {
		o.BPP = 16
	}
	if o.Files.SearchBytes == 0 {
		o.Files = FileSizes{SearchBytes: 64 << 20, CompressBytes: 8 << 20, ScrollLines: 3000, FolderFiles: 40}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Outcome is what a run found, beside the result it wrote.
type Outcome struct {
	// Ramps are the measuring ramps through the gateway, in order; Median
	// is the one whose degradation point is the median, Worst the one
	// that degraded first.
	Ramps         []Ramp
	Median, Worst int
	// Steps, Baseline, Degradation, Crossings and Limiting are the median
	// ramp's: the run's headline.
	Steps       []Step
	BrokerSteps []Step // the broker ramp (none with SuggestOnly but no SessionLimit)
	Baseline    float64
	Degradation Degradation
	Crossings   []Crossing
	Limiting    string
	// SuggestLimit is one below the worst ramp's degradation point.
	SuggestLimit int
	// BrokerLimit is the session limit the broker ramp ran with.
	BrokerLimit int
	// BrokerLast is the user count of the broker's last placement in the
	// broker ramp, BrokerRefusal its answer to the next launch.
	BrokerLast    int
	BrokerRefusal string
}

// Run runs the ramps and writes the result into o.Out.
func Run(ctx context.Context, o Options) (*report.Result, *Outcome, error) {
	o.defaults()
	dir, err := os.MkdirTemp("", "deskway-sessionhost-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	r := &rig{o: o, dir: dir}
	defer r.close()
	if err := r.setUp(ctx); err != nil {
		return nil, nil, err
	}
	res := &report.Result{Bench: "sessionhost", Command: o.Command, Started: time.Now().UTC(), Machine: report.ThisMachine(),
		Summary: map[string]float64{}, SummaryText: map[string]string{}}
	out := &Outcome{}

	for i := 1; i <= o.Ramps; i++ {
		if i > 1 {
			r.waitCPUCalm(ctx)
		}
		if err := r.startBroker(ctx, "measure", 0); err != nil {
			return nil, nil, err
		}
		o.Log.Info("ramp through the gateway: a user logs on every interval", "ramp", i, "of", o.Ramps, "users", o.Users, "interval", o.Interval)
		steps, err := r.ramp(ctx, false, o.Users)
		r.stopBroker()
		if err != nil {
			return nil, nil, err
		}
		ramp := Analyze(steps, o.BaselineSteps, o.AddMS, Thresholds(config.DefaultHealth()))
		o.Log.Info("ramp measured", "ramp", i, "degradation_users", ramp.Degradation.Users, "why", ramp.Degradation.Why, "limiting", ramp.Limiting)
		out.Ramps = append(out.Ramps, ramp)
	}
	out.Median, out.Worst = MedianRamp(out.Ramps), WorstRamp(out.Ramps)
	m := out.Ramps[out.Median]
	out.Steps, out.Baseline, out.Degradation, out.Crossings, out.Limiting = m.Steps, m.Baseline, m.Degradation, m.Crossings, m.Limiting
	out.SuggestLimit = SuggestLimit(out.Ramps[out.Worst].Degradation)

	out.BrokerLimit = out.SuggestLimit
	if o.SessionLimit > 0 {
		out.BrokerLimit = o.SessionLimit
	}
	if (!o.SuggestOnly || o.SessionLimit > 0) && out.BrokerLimit > 0 {
		// The last ramp's users have only just gone: their waiting is still
		// in the kernel's 10-second pressure average, and the broker would
		// take the host for saturated before anyone logged on.
		r.waitCPUCalm(ctx)
		if err := r.startBroker(ctx, "place", out.BrokerLimit); err != nil {
			return nil, nil, err
		}
		// One launch past the limit: the broker should refuse it.
		o.Log.Info("ramp through the broker", "session_limit", out.BrokerLimit)
		out.BrokerSteps, err = r.ramp(ctx, true, min(o.Users, out.BrokerLimit+1))
		r.stopBroker()
		if err != nil {
			return nil, nil, err
		}
		for _, s := range out.BrokerSteps {
			if s.Placed {
				out.BrokerLast = s.Users
			} else {
				out.BrokerRefusal = s.LogonFailed
				break
			}
		}
	}
	summarize(res, out, o)
	if o.Out != "" {
		if err := write(res, out, o); err != nil {
			return nil, nil, err
		}
	}
	return res, out, nil
}

// ramp logs users on one per interval and measures each step, until
// maxUsers, a failed logon, or (measuring) Beyond steps past the
// degradation point. It ends every session before it returns.
func (r *rig) ramp(ctx context.Context, viaBroker bool, maxUsers int) ([]Step, error) {
	var clients []*childproc.Proc
	defer func() {
		for _, c := range clients {
			c.Stop()
		}
		r.endSessions()
		r.waitSessionsGone(ctx)
	}()
	var steps []Step
	for n := 1; n <= maxUsers; n++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		user := r.users[n-1]
		step := Step{Users: n, Placed: true}
		c, err := r.logon(ctx, user, viaBroker, &step)
		if c != nil {
			clients = append(clients, c)
		}
		if err != nil {
			return nil, err
		}
		if step.LogonFailed != "" {
			r.o.Log.Warn("logon failed", "users", n, "why", step.LogonFailed)
			steps = append(steps, step)
			break
		}
		if err := r.measure(ctx, clients, &step); err != nil {
			return nil, err
		}
		r.o.Log.Info("step", "users", n, "logon_s", fmt.Sprintf("%.1f", step.LogonS), "actions", len(step.all()),
			"mean_ms", fmt.Sprintf("%.0f", step.Mean()), "p95_ms", fmt.Sprintf("%.0f", step.Percentile(95)),
			"machine_cpu_pct", fmt.Sprintf("%.0f", step.MachineCPUPct), "client_cpu_pct", fmt.Sprintf("%.0f", step.ClientCPUPct),
			"mem_per_session_mib", fmt.Sprintf("%.0f", step.MemPerSession/(1<<20)), "failed", step.Failed)
		steps = append(steps, step)
		if d := FindDegradation(steps, r.o.BaselineSteps, r.o.AddMS); !viaBroker && d.Users > 0 && n >= d.Users+r.o.Beyond {
			break
		}
	}
	return steps, nil
}

// logon starts user's client, through a token of its own (measuring) or
// the broker's .rdp file, and waits for the session's workload to
// report. A failed logon is recorded in step, not returned.
func (r *rig) logon(ctx context.Context, user string, viaBroker bool, step *Step) (*childproc.Proc, error) {
	ready := r.col.expect(user)
	common := []string{"/u:" + user, "/p:" + r.password, "/cert:ignore", "/size:" + r.o.Size, "/bpp:" + strconv.Itoa(r.o.BPP),
		"-wallpaper", "-themes", "/log-level:ERROR"}
	var args []string
	if viaBroker {
		rdp, status, err := r.launch(ctx, user)
		if err != nil {
			step.Placed = false
			step.LogonFailed = fmt.Sprintf("the broker placed no session (HTTP %d): %v", status, err)
			return nil, nil
		}
		file := filepath.Join(r.dir, user+".rdp")
		if err := os.WriteFile(file, []byte(rdp), 0o600); err != nil {
			return nil, err
		}
		args = append([]string{file, "/gt:http"}, common...)
	} else {
		tok, err := r.mintToken(user)
		if err != nil {
			return nil, err
		}
		args = append([]string{fmt.Sprintf("/v:127.0.0.1:%d", r.rdpPort), fmt.Sprintf("/g:127.0.0.1:%d", r.gwPort), "/gat:" + tok, "/gt:http"}, common...)
	}
	start := time.Now()
	c, err := childproc.Start([]string{"DISPLAY=" + r.display}, "xfreerdp", args...)
	if err != nil {
		return nil, err
	}
	select {
	case <-ready:
		step.LogonS = time.Since(start).Seconds()
	case <-c.Exited():
		step.LogonFailed = "xfreerdp ended before the desktop's workload started: " + c.Tail(5)
	case <-time.After(r.o.LogonTimeout):
		step.LogonFailed = fmt.Sprintf("the workload did not start within %v of starting xfreerdp: %s", r.o.LogonTimeout, c.Tail(5))
	case <-ctx.Done():
		return c, ctx.Err()
	}
	return c, nil
}

// measure waits one interval and fills in the step's actions and counters.
func (r *rig) measure(ctx context.Context, clients []*childproc.Proc, step *Step) error {
	c0, err := agent.ReadCounters("/proc")
	if err != nil {
		return err
	}
	cl0, gw0, rest0, self0 := r.clientCPU(clients), cpuOf(r.gw.Pid()), cpuOf(r.rest.Pid()), cpuOf(0)
	from := time.Now()
	select {
	case <-time.After(r.o.Interval):
	case <-ctx.Done():
		return ctx.Err()
	}
	to := time.Now()
	c1, err := agent.ReadCounters("/proc")
	if err != nil {
		return err
	}
	cl1, gw1, rest1, self1 := r.clientCPU(clients), cpuOf(r.gw.Pid()), cpuOf(r.rest.Pid()), cpuOf(0)
	all := to.Sub(from).Seconds() * float64(runtime.NumCPU()) / 100 // CPU seconds in one percent of the machine
	l := agent.Between(c0, c1)
	step.MachineCPUPct = l.CPU * 100
	step.ClientCPUPct = (cl1 - cl0).Seconds() / all
	step.GatewayCPUPct = (gw1 - gw0).Seconds() / all
	step.HostCPUPct = max(0, step.MachineCPUPct-step.ClientCPUPct-step.GatewayCPUPct-((rest1-rest0)+(self1-self0)).Seconds()/all)
	step.MemUsedPct = l.Memory * 100
	step.DiskIdlePct = l.DiskIdle * 100
	step.DiskLatencyMS = l.DiskLatencyMS
	step.MemPressurePct = l.MemoryPressure * 100
	step.CPUPressurePct = l.CPUPressure * 100
	step.MajorFaultsPerS, step.SwapInPerS, step.SwapOutPerS = l.MajorFaultsPerSec, l.SwapInPerSec, l.SwapOutPerSec
	step.Actions, step.Failed = map[string][]float64{}, map[string]int{}
	for _, rep := range r.col.between(from, to) {
		if rep.Failed {
			step.Failed[rep.Action]++
			continue
		}
		step.Actions[rep.Action] = append(step.Actions[rep.Action], rep.MS)
	}
	usage, err := agent.ReadSessionUsage("/proc")
	if err != nil {
		return err
	}
	var pss float64
	for _, u := range usage {
		pss += float64(u.PSSBytes)
	}
	if len(usage) > 0 {
		step.MemPerSession = pss / float64(len(usage))
	}
	step.SessionsMeasured = len(usage)
	return nil
}

// clientCPU is the CPU time of the live clients and the X server they
// draw into.
func (r *rig) clientCPU(clients []*childproc.Proc) time.Duration {
	t := cpuOf(r.xvfb.Pid())
	for _, c := range clients {
		t += cpuOf(c.Pid())
	}
	return t
}

func cpuOf(pid int) time.Duration {
	s, err := procstat.Read(pid)
	if err != nil {
		return 0
	}
	return s.CPU
}

// waitSessionsGone waits (up to half a minute) until xrdp's sessions of
// the bench users have ended, so that a next ramp starts on an idle host.
func (r *rig) waitSessionsGone(ctx context.Context) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(500 * time.Millisecond) {
		usage, err := agent.ReadSessionUsage("/proc")
		if err == nil && len(usage) == 0 {
			return
		}
		r.endSessions()
	}
}

// quietCPUPressurePct is the CPU pressure under which a host counts as
// idle again between ramps; calmWait is the longest the bench waits for
// it by default: the 10-second average falls from 90 % to 5 % in about 30 s once
// nothing waits, and a machine busy with other work may never get there.
const (
	quietCPUPressurePct = 5
	calmWait            = 40 * time.Second
)

// waitCPUCalm waits until the machine's CPU pressure (some avg10) is under
// quietCPUPressurePct, or for at most Options.CalmWait.
func (r *rig) waitCPUCalm(ctx context.Context) {
	if r.o.CalmWait < 0 {
		return
	}
	deadline := time.Now().Add(r.o.CalmWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		c, err := agent.ReadCounters("/proc")
		if err != nil || c.CPUSome10 < quietCPUPressurePct {
			return
		}
		time.Sleep(time.Second)
	}
	r.o.Log.Warn("the host's CPU pressure stayed high between ramps", "limit", r.o.CalmWait)
}
