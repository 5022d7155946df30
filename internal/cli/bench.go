package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/deskway/deskway/internal/bench/bootstorm"
	"github.com/deskway/deskway/internal/bench/brokerbench"
	"github.com/deskway/deskway/internal/bench/browserbench"
	"github.com/deskway/deskway/internal/bench/echo"
	"github.com/deskway/deskway/internal/bench/gwbench"
	"github.com/deskway/deskway/internal/bench/nbdfloor"
	"github.com/deskway/deskway/internal/bench/netbootbench"
	"github.com/deskway/deskway/internal/bench/portalbench"
	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/bench/sessionhost"
	"github.com/deskway/deskway/internal/bench/ttff"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/obs"
	"github.com/deskway/deskway/internal/tlsconf"
)

func benchCmd() *cobra.Command {
	c := &cobra.Command{Use: "bench", Short: "The papers' test tools: load, echo server, throughput; results in docs/benchmarks shape"}
	c.AddCommand(echoServerCmd(), nbdFloorCmd(), benchGatewayCmd(), benchThroughputCmd(), benchBootstormCmd(), benchBrokerCmd(), benchPortalCmd(), benchBrowserCmd(), benchNetbootCmd(), benchSessionhostCmd(), benchSiteCmd(), benchFaultsCmd(), benchTTFFCmd())
	return c
}

func echoServerCmd() *cobra.Command {
	var listen, tlsListen, cert, key string
	c := &cobra.Command{
		Use:   "echo-server",
		Short: "Stand-in RDP host (TSGSServer): answers each request with N packets of M bytes, or streams bulk data",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := obs.NewLogger(cmd.ErrOrStderr(), "info", "auto")
			g, ctx := errgroup.WithContext(cmd.Context())
			s := &echo.Server{Log: log}
			if listen != "" {
				ln, err := net.Listen("tcp", listen)
				if err != nil {
					return fmt.Errorf("echo-server: %w", err)
				}
				g.Go(func() error { return s.Serve(ctx, ln, nil) })
			}
			if tlsListen != "" {
				tc, err := tlsconf.Load(cert, key, os.TempDir(), nil)
				if err != nil {
					return err
				}
				ln, err := net.Listen("tcp", tlsListen)
				if err != nil {
					return fmt.Errorf("echo-server: %w", err)
				}
				g.Go(func() error { return s.Serve(ctx, ln, tc) })
			}
			if listen == "" && tlsListen == "" {
				return errors.New("echo-server: give --listen, --tls-listen or both")
			}
			log.Info("echo server ready", "listen", listen, "tls_listen", tlsListen)
			return g.Wait()
		},
	}
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:1234", "plain TCP address (what the gateway dials)")
	c.Flags().StringVar(&tlsListen, "tls-listen", "", "TLS address (the direct baseline, same TLS as the gateway)")
	c.Flags().StringVar(&cert, "cert", "", "certificate for --tls-listen")
	c.Flags().StringVar(&key, "key", "", "key for --tls-listen")
	return c
}

func nbdFloorCmd() *cobra.Command {
	var listen, file string
	c := &cobra.Command{
		Use:   "nbd-floor",
		Short: "The least an NBD server can do (reads by sendfile from one file, writes dropped unstored): the boot storm's measure of the machine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := obs.NewLogger(cmd.ErrOrStderr(), "info", "auto")
			if file == "" {
				return errors.New("nbd-floor: give --file, the image every export reads")
			}
			f, err := os.Open(file)
			if err != nil {
				return fmt.Errorf("nbd-floor: %w", err)
			}
			defer f.Close()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("nbd-floor: %w", err)
			}
			log.Info("nbd floor ready: writes are acknowledged and not stored", "listen", ln.Addr().String(), "file", file)
			return (&nbdfloor.Server{Base: f, Log: log}).Serve(cmd.Context(), ln)
		},
	}
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:10809", "TCP address")
	c.Flags().StringVar(&file, "file", "", "image file every export reads")
	return c
}

type benchFlags struct {
	scenario, out, steps, cpuLoads string
	warmup, window, tput           time.Duration
	relayLoops, runs               int
	compareExe                     string
}

func (f *benchFlags) register(c *cobra.Command, scenario string) {
	c.Flags().StringVar(&f.out, "out", "", "directory for result.json, result.md and charts")
	c.Flags().StringVar(&f.scenario, "scenario", scenario, "comma-separated: "+strings.Join(gwbench.AllScenarios, ", ")+", or all")
	c.Flags().StringVar(&f.steps, "steps", "", "tunnel counts of each ramp, comma-separated (default 100 … 8000)")
	c.Flags().DurationVar(&f.warmup, "warmup", 2*time.Second, "settle time after each ramp step")
	c.Flags().DurationVar(&f.window, "window", 4*time.Second, "measurement window of each ramp step")
	c.Flags().DurationVar(&f.tput, "throughput-duration", 10*time.Second, "length of each throughput measurement")
	c.Flags().IntVar(&f.relayLoops, "relay-loops", -1, "the gateway's relay_loops (default: its own, two event loops per CPU; 0: goroutines)")
	c.Flags().IntVar(&f.runs, "runs", 3, "runs of the KW v1 and v2 ramps and the throughput test for every system, interleaved")
	c.Flags().StringVar(&f.cpuLoads, "cpu-loads", "1000,2000", "KW v1 tunnel counts where CPU per round trip and memory per tunnel are compared")
	c.Flags().StringVar(&f.compareExe, "compare-exe", "", "another deskway binary whose gateway runs as a fourth system, \"deskway-compare\", beside deskway in every run (a change measured side by side)")
}

func (f *benchFlags) run(ctx context.Context, cmd *cobra.Command, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	o := gwbench.Options{Exe: exe, Out: f.out, Warmup: f.warmup, Window: f.window, ThroughputD: f.tput, RelayLoops: f.relayLoops,
		CompareExe: f.compareExe, Command: "deskway " + strings.Join(os.Args[1:], " "), Log: obs.NewLogger(cmd.ErrOrStderr(), "info", "auto")}
	if f.scenario == "all" {
		o.Scenarios = gwbench.AllScenarios
	} else {
		o.Scenarios = strings.Split(f.scenario, ",")
	}
	if o.Steps, err = counts("--steps", f.steps); err != nil {
		return err
	}
	if o.CPULoads, err = counts("--cpu-loads", f.cpuLoads); err != nil {
		return err
	}
	if f.runs < 1 {
		return fmt.Errorf("bench: --runs %d: give at least one run", f.runs)
	}
	o.Runs = f.runs
	res, err := gwbench.Run(ctx, o)
	if err != nil {
		return err
	}
	printSummary(cmd, res, f.out)
	return nil
}

func benchBootstormCmd() *cobra.Command {
	var (
		out, scenario, clients, readers, tracePath, systems string
		scale                                               float64
		readFor                                             time.Duration
		qd, runs                                            int
		discard, verify                                     bool
	)
	c := &cobra.Command{
		Use:   "bootstorm",
		Short: "vDisk boot storm: N clients replay a recorded boot at once against deskway stream and the stock NBD servers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			o := bootstorm.Options{Exe: exe, Out: out, TimeScale: scale, ReadFor: readFor, QueueDepth: qd, Runs: runs, DiscardReads: discard, Verify: verify,
				Command: "deskway " + strings.Join(os.Args[1:], " "), Log: obs.NewLogger(cmd.ErrOrStderr(), "info", "auto")}
			if scenario == "all" {
				o.Scenarios = bootstorm.Scenarios
			} else {
				o.Scenarios = strings.Split(scenario, ",")
			}
			if o.Clients, err = counts("--clients", clients); err != nil {
				return err
			}
			if o.Readers, err = counts("--readers", readers); err != nil {
				return err
			}
			if systems != "" {
				o.Systems = strings.Split(systems, ",")
			}
			if tracePath != "" {
				if o.Trace, err = os.ReadFile(tracePath); err != nil {
					return fmt.Errorf("bench: --trace: %w", err)
				}
			}
			res, err := bootstorm.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			printSummary(cmd, res, out)
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "directory for result.json, result.md and charts")
	c.Flags().StringVar(&scenario, "scenario", "all", "comma-separated: storm, read, or all")
	c.Flags().StringVar(&clients, "clients", "", "storm sizes, comma-separated (default 1,5,10,25,50,75,100,250,500,1000)")
	c.Flags().StringVar(&readers, "readers", "", "reader counts of the aggregate read test (default 10,25,50)")
	c.Flags().StringVar(&tracePath, "trace", "", "boot trace CSV (ms,op,offset,length); default the committed recording")
	c.Flags().Float64Var(&scale, "time-scale", 1, "multiplies the trace's think time; 0 replays as fast as answers come")
	c.Flags().DurationVar(&readFor, "read-duration", 5*time.Second, "length of each aggregate-read step")
	c.Flags().IntVar(&qd, "queue-depth", 4, "requests each booting client keeps in flight")
	c.Flags().StringVar(&systems, "systems", "", "only these, comma-separated: deskway, nbd-server-cow, nbdkit-cow, qemu-nbd, floor (the machine's limit: an NBD responder that stores nothing) (default all)")
	c.Flags().IntVar(&runs, "runs", 3, "storms per step; each point is the median run")
	c.Flags().BoolVar(&discard, "discard-reads", false, "clients drop read data in the kernel (MSG_TRUNC) instead of copying it, as separate client machines would spare this box")
	c.Flags().BoolVar(&verify, "verify", false, "clients compare every byte they read outside the trace's writes with the base image, and fail on a difference (for smoke runs: it costs the clients time)")
	return c
}

// counts parses a comma-separated list of positive integers.
func counts(flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bench: %s: %q is not a positive count", flag, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func benchGatewayCmd() *cobra.Command {
	f := &benchFlags{}
	c := &cobra.Command{
		Use:   "gateway",
		Short: "RD Gateway capacity (TSGSClient): ramp tunnels through deskway, the direct path and HAProxy",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return f.run(cmd.Context(), cmd, args) },
	}
	f.register(c, "all")
	return c
}

func benchThroughputCmd() *cobra.Command {
	f := &benchFlags{}
	c := &cobra.Command{
		Use:   "throughput",
		Short: "Bulk throughput (ctsTraffic): 1 and 8 streams through deskway, direct and HAProxy",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return f.run(cmd.Context(), cmd, args) },
	}
	f.register(c, "throughput")
	return c
}

func benchBrokerCmd() *cobra.Command {
	var (
		out, conc, rtts, systems, modes string
		e2eConc, e2eRTTs                string
		o                               brokerbench.Options
	)
	c := &cobra.Command{
		Use:   "broker",
		Short: "Brokering storm: simulated hosts, 10,000 launches at fixed concurrency, PostgreSQL behind injected latency; the paper's tables",
		Args:  cobra.NoArgs,
		RunE: runBench(&out, func(ctx context.Context, r benchRun) (*report.Result, error) {
			var err error
			if o.Concurrency, err = counts("--concurrency", conc); err != nil {
				return nil, err
			}
			if o.RTTs, err = durations("--rtt", rtts); err != nil {
				return nil, err
			}
			if o.E2E.Concurrency, err = counts("--e2e-concurrency", e2eConc); err != nil {
				return nil, err
			}
			if o.E2E.RTTs, err = durations("--e2e-rtt", e2eRTTs); err != nil {
				return nil, err
			}
			if o.E2E.RelaunchShare < 0 || o.E2E.RelaunchShare >= 1 || o.E2E.LogoffShare < 0 || o.E2E.LogoffShare >= 1 {
				return nil, errors.New("bench: --relaunch-share and --logoff-share are fractions from 0 to below 1")
			}
			o.Modes = strings.Split(modes, ",")
			if systems != "" {
				o.Systems = strings.Split(systems, ",")
			}
			o.Out, o.Command, o.Log = r.out, r.command, r.log
			return brokerbench.Run(ctx, o)
		}),
	}
	c.Flags().StringVar(&out, "out", "", "directory for result.json, result.md and charts")
	c.Flags().IntVar(&o.Hosts, "hosts", 57, "simulated session hosts in the delivery group")
	c.Flags().IntVar(&o.Launches, "launches", 10000, "user launches per point")
	c.Flags().StringVar(&conc, "concurrency", "12,24,36,48,60", "launches in flight, comma-separated")
	c.Flags().StringVar(&rtts, "rtt", "10ms,45ms,90ms,160ms,250ms", "broker-to-PostgreSQL round trips, comma-separated")
	c.Flags().StringVar(&systems, "systems", "postgres,sqlite", "databases: postgres (over each RTT), sqlite (embedded)")
	c.Flags().IntVar(&o.LogonLimit, "logon-limit", 5, "per-host launches not yet logged on")
	c.Flags().DurationVar(&o.LogonAfter, "logon-after", 100*time.Millisecond, "placement mode: how often a simulated host reports logons")
	c.Flags().StringVar(&modes, "mode", "placement,e2e", "placement (sessions log on at once, the paper's setting), e2e (real logon times, hosts that fill, relaunches, logoffs)")
	c.Flags().IntVar(&o.E2E.Launches, "e2e-launches", 1500, "e2e mode: launches per point")
	c.Flags().StringVar(&e2eConc, "e2e-concurrency", "12,60", "e2e mode: launches in flight, comma-separated")
	c.Flags().StringVar(&e2eRTTs, "e2e-rtt", "10ms,250ms", "e2e mode: broker-to-PostgreSQL round trips, comma-separated")
	c.Flags().DurationVar(&o.E2E.LogonMedian, "logon-median", 20*time.Second, "e2e mode: median logon time (log-normal)")
	c.Flags().Float64Var(&o.E2E.LogonSigma, "logon-sigma", 0.35, "e2e mode: σ of the logon time's logarithm")
	c.Flags().DurationVar(&o.E2E.SessionPoll, "session-poll", time.Second, "e2e mode: how often each host's agent reads its sessions (agent.session_poll)")
	c.Flags().Float64Var(&o.E2E.RelaunchShare, "relaunch-share", 0.10, "e2e mode: share of launches that are users launching again while their session runs")
	c.Flags().Float64Var(&o.E2E.LogoffShare, "logoff-share", 0.05, "e2e mode: share of new sessions that log off soon after logon")
	return c
}

// durations parses a comma-separated list of non-negative durations.
func durations(flag, list string) ([]time.Duration, error) {
	var out []time.Duration
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("bench: %s: %q is not a duration like 45ms", flag, s)
		}
		out = append(out, d)
	}
	return out, nil
}

func benchBrowserCmd() *cobra.Command {
	var out string
	var o browserbench.Options
	c := &cobra.Command{
		Use:   "browser",
		Short: "Desktops in a browser tab beside xfreerdp through the same gateway, on one xrdp session: click to first frame, frames while a window moves, gateway CPU",
		Long: `Starts xrdp (as root: it adds the host user dwbench), a deskway gateway
on its own, the broker, agent and portal, chromium and an Xvfb for
xfreerdp, all on loopback, and takes turns between the two clients.`,
		Args: cobra.NoArgs,
		RunE: runBench(&out, func(ctx context.Context, r benchRun) (*report.Result, error) {
			o.Out, o.Command, o.Log = r.out, r.command, r.log
			return browserbench.Run(ctx, o)
		}),
	}
	c.Flags().StringVar(&out, "out", "", "directory for result.json, result.md and the chart")
	c.Flags().IntVar(&o.Runs, "runs", 5, "runs of each client, taking turns")
	c.Flags().DurationVar(&o.Window, "window", 10*time.Second, "how long frames and gateway CPU are measured while the window moves")
	c.Flags().StringSliceVar(&o.Compression, "browser-compression", []string{config.BrowserCompressionContext, config.BrowserCompressionMessage, config.BrowserCompressionOff},
		"the gateway's browser_compression settings to measure the browser with, each in every run")
	return c
}

func benchTTFFCmd() *cobra.Command {
	var out string
	var o ttff.Options
	c := &cobra.Command{
		Use:   "ttff",
		Short: "xfreerdp's time to first frame straight to xrdp, through HAProxy in TCP mode and through the gateway (both transports, both authentications), taking turns, with its 100 ms waits counted",
		Long: `Starts xrdp (as root: it adds the host user dwttff), HAProxy in TCP
mode, a deskway gateway and an Xvfb for xfreerdp, all on loopback, and
connects xfreerdp under strace by each way in turn.`,
		Args: cobra.NoArgs,
		RunE: runBench(&out, func(ctx context.Context, r benchRun) (*report.Result, error) {
			o.Out, o.Command, o.Log = r.out, r.command, r.log
			return ttff.Run(ctx, o)
		}),
	}
	c.Flags().StringVar(&out, "out", "", "directory for result.json and result.md")
	c.Flags().IntVar(&o.Runs, "runs", 5, "runs of each system, taking turns")
	c.Flags().StringVar(&o.Traces, "traces", "", "directory to keep each system's last strace of xfreerdp in")
	c.Flags().BoolVar(&o.Everything, "trace-io", false, "trace xfreerdp's reads and writes too (slower: to find where a wait comes from, not for the times)")
	return c
}

func benchPortalCmd() *cobra.Command {
	var out string
	var o portalbench.Options
	c := &cobra.Command{
		Use:   "portal",
		Short: "Launches through the portal beside the bare broker API (same broker, taking turns), and console pages with 10,000 sessions",
		Args:  cobra.NoArgs,
		RunE: runBench(&out, func(ctx context.Context, r benchRun) (*report.Result, error) {
			o.Out, o.Command, o.Log = r.out, r.command, r.log
			return portalbench.Run(ctx, o)
		}),
	}
	c.Flags().StringVar(&out, "out", "", "directory for result.json, result.md and the chart")
	c.Flags().IntVar(&o.Runs, "runs", 5, "runs of each system, taking turns")
	c.Flags().IntVar(&o.Users, "users", 5000, "new users launching in each run of each system")
	c.Flags().IntVar(&o.Sessions, "sessions", 10000, "live sessions in the database when the console is timed")
	c.Flags().IntVar(&o.Concurrency, "concurrency", 16, "launches in flight")
	c.Flags().IntVar(&o.ConsoleRequests, "console-requests", 300, "timed requests per console page")
	return c
}

// benchRun is what a bench subcommand hands its bench: the directory
// for its results (--out), the command line that made them, and the log.
type benchRun struct {
	out, command string
	log          *slog.Logger
}

// runBench is the RunE of a bench subcommand: run takes the bench from
// its flags to its result, whose headline figures are printed after.
func runBench(out *string, run func(ctx context.Context, r benchRun) (*report.Result, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		res, err := run(cmd.Context(), benchRun{out: *out, command: "deskway " + strings.Join(os.Args[1:], " "),
			log: obs.NewLogger(cmd.ErrOrStderr(), "info", "auto")})
		if err != nil {
			return err
		}
		printSummary(cmd, res, *out)
		return nil
	}
}

// printSummary prints a bench's headline figures and where its results went.
func printSummary(cmd *cobra.Command, res *report.Result, out string) {
	for k, v := range res.Summary {
		fmt.Fprintf(cmd.OutOrStdout(), "%s\t%g\n", k, v)
	}
	for k, v := range res.SummaryText {
		fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", k, v)
	}
	if out != "" {
		fmt.Fprintf(cmd.OutOrStdout(), "results in %s\n", out)
	}
}

func benchNetbootCmd() *cobra.Command {
	var out string
	var o netbootbench.Options
	c := &cobra.Command{
		Use:   "netboot",
		Short: "Power-on to the vDisk's init for a PXE boot from deskway, beside the LTSP stack (dnsmasq proxyDHCP and TFTP, nbd-server) and qemu's own NBD client, one VM and several at once (root; makes its own network namespaces)",
		Args:  cobra.NoArgs,
		RunE: runBench(&out, func(ctx context.Context, r benchRun) (*report.Result, error) {
			o.Out, o.Command, o.Log = r.out, r.command, r.log
			return netbootbench.Run(ctx, o)
		}),
	}
	c.Flags().StringVar(&out, "out", "", "directory for result.json and result.md")
	c.Flags().IntVar(&o.Runs, "runs", 3, "runs of each system, taking turns")
	c.Flags().StringVar(&o.Helper, "nbdroot", "", "the deskway-nbdroot program (default: beside this deskway)")
	c.Flags().IntSliceVar(&o.AtOnce, "at-once", []int{4}, "numbers of VMs booted at once through each system (2 to 9; 0 for none)")
	c.Flags().IntSliceVar(&o.AtOnceDeskway, "at-once-deskway", []int{8}, "numbers of VMs booted at once through deskway alone (2 to 9; 0 for none)")
	return c
}

func benchSessionhostCmd() *cobra.Command {
	var out string
	var o sessionhost.Options
	c := &cobra.Command{
		Use:   "sessionhost",
		Short: "How many users one xrdp session host holds before they feel it: users log on one by one through the gateway and run a timed workload; then the same ramp through the broker",
		Long: `Starts xrdp (as root: it adds the host users dwload01…), a deskway
gateway, the broker with the host's agent, and an Xvfb for the xfreerdp
clients, all on loopback. Users log on one per --interval and run a
knowledge worker's actions in their desktops, timed inside the session.
The degradation point is the first user count whose average action time
passes the first users' average plus a second, or whose logon fails.
Then the broker, with the session limit this suggests, places the same
ramp: it must stop at or before that point.

The measuring ramp runs --ramps times (3 by default): the point moves
from ramp to ramp, and the suggested limit is one below the ramp that
degraded first. --suggest-limit prints the delivery group setting for a
host like this one and runs no broker ramp, unless --session-limit names
a limit to check beside it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Out, o.Command = out, "deskway "+strings.Join(os.Args[1:], " ")
			o.Log = obs.NewLogger(cmd.ErrOrStderr(), "info", "auto")
			if o.CalmWait == 0 {
				o.CalmWait = -1 // the flag's 0 is "do not wait"; the option's is the default
			}
			res, outcome, err := sessionhost.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			printSummary(cmd, res, out)
			if o.SuggestOnly {
				text, err := sessionhost.Suggestion(outcome.Ramps)
				if err != nil {
					return fmt.Errorf("bench: %w", err)
				}
				fmt.Fprint(cmd.OutOrStdout(), text)
			}
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "directory for result.json, result.md and the charts")
	c.Flags().IntVar(&o.Users, "users", 24, "most users a ramp logs on")
	c.Flags().DurationVar(&o.Interval, "interval", 20*time.Second, "time between logons: each step's measuring window")
	c.Flags().DurationVar(&o.Think, "think", time.Second, "idle time after each action")
	c.Flags().IntVar(&o.BaselineSteps, "baseline-steps", 2, "first steps whose actions make the baseline")
	c.Flags().Float64Var(&o.AddMS, "threshold-ms", 1000, "how far above the baseline the average action may go")
	c.Flags().IntVar(&o.Ramps, "ramps", 3, "measuring ramps, one after the other; the suggested limit is one below the one that degraded first")
	c.Flags().IntVar(&o.Beyond, "beyond", 1, "steps a measuring ramp goes on past its degradation point")
	c.Flags().BoolVar(&o.SuggestOnly, "suggest-limit", false, "print the session limit the measuring ramps suggest; no broker ramp without --session-limit")
	c.Flags().IntVar(&o.SessionLimit, "session-limit", 0, "the broker ramp's session limit, in place of the suggested one (to check a chosen limit)")
	c.Flags().Float64Var(&o.CPUPressureMaxPct, "cpu-pressure-max-pct", 0, "the broker ramp's broker.health.cpu_pressure_max_pct (0: the broker's default); 100 turns it off")
	c.Flags().DurationVar(&o.CalmWait, "calm-wait", 40*time.Second, "longest wait before each later ramp for the host's CPU pressure to settle; 0 does not wait")
	return c
}
