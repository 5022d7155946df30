// Package sitebench measures the site gateway beside the RAS Gateway
// paper's figures: TCP throughput from an office's host to a hosted
// desktop, with 1 connection and with 8, through deskway site's GRE and
// WireGuard tunnels, through wireguard-go's own program (the best
// userspace tunnel, the same TUN layer), through the kernel's VXLAN (the
// in-kernel tunnel the test kernels have: the ceiling for encapsulation)
// and routed directly over veths (no tunnel at all); the machine's CPU
// per Gbit/s for each; and the failover of a pair of GRE gateways, the
// active one killed under 8 TCP connections (failover.go). Every system
// runs in network namespaces of its own that the bench makes and removes.
package sitebench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// Options configure a run.
type Options struct {
	// Runs of every system, interleaved (the order turns each run).
	Runs int
	// Window is how long bytes are counted; Warmup runs before it
	// uncounted, for TCP to reach its pace.
	Window, Warmup time.Duration
	// Deskway is the deskway binary run as the site gateway (this one
	// by default).
	Deskway string
	// WireGuardGo is a wireguard-go program to compare with; empty: the
	// module proxy's latest version is built into Cache.
	WireGuardGo, Cache string
	// Systems limits the systems measured (default all).
	Systems []string
	// Profile, if set, is a folder for CPU profiles of deskway's GRE
	// and WireGuard gateways and offices, taken over the first run's
	// windows.
	Profile      string
	Out, Command string
	Log          *slog.Logger
}

// Connections are the connection counts measured: the paper's one, and
// many.
var Connections = []int{1, 8}

// wireGuardModule is wireguard-go's module, whose root is its program.
const wireGuardModule = "golang.zx2c4.com/wireguard"

// Run measures every system and writes the results to o.Out.
func Run(ctx context.Context, o Options) (*report.Result, error) {
	if o.Runs < 1 {
		o.Runs = 3
	}
	if o.Window <= 0 {
		o.Window = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if len(o.Systems) == 0 {
		o.Systems = Systems
	}
	for _, s := range o.Systems {
		if !slices.Contains(Systems, s) {
			return nil, fmt.Errorf("site bench: no system %q (the systems: %s)", s, strings.Join(Systems, ", "))
		}
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("site bench: run as root (it makes network namespaces, veths, TUN and VXLAN devices)")
	}
	for _, p := range []string{"ip", "tc", "nsenter"} {
		if _, err := exec.LookPath(p); err != nil {
			return nil, fmt.Errorf("site bench: %s is needed (iproute2, util-linux)", p)
		}
	}
	e := &env{deskway: o.Deskway}
	if e.deskway == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		e.deskway = exe
	}
	dir, err := os.MkdirTemp("", "sitebench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	e.dir = dir
	res := &report.Result{Bench: "site", Command: o.Command, Started: time.Now().UTC(), Machine: report.ThisMachine(),
		Summary: map[string]float64{}, SummaryText: map[string]string{}}
	var wgVersion string
	if slices.Contains(o.Systems, sysWGGo) {
		e.wgGo, wgVersion, e.wgGoWhy = wireGuardGo(ctx, o)
		res.SummaryText["wireguard_go_version"] = wgVersion
		if e.wgGoWhy != "" {
			o.Log.Warn("wireguard-go is skipped", "why", e.wgGoWhy)
		}
	}
	res.Notes = append(res.Notes, "load average at the start: "+loadAvg())
	runs := make([]map[string]sample, o.Runs)
	skipped := map[string]string{}
	// The failover scenario takes its turn among the systems, as often.
	turns := append(slices.Clone(o.Systems), scenarioFailover)
	fe := &failoverEnv{}
	defer fe.close()
	var failovers []failoverSample
	for run := 1; run <= o.Runs; run++ {
		runs[run-1] = map[string]sample{}
		for i := range turns {
			sys := turns[(i+run-1)%len(turns)]
			if _, ok := skipped[sys]; ok {
				continue
			}
			if sys == scenarioFailover {
				s, err := e.measureFailover(ctx, o, fe)
				if errors.Is(err, errSkip) {
					skipped[sys] = strings.TrimPrefix(err.Error(), errSkip.Error()+": ")
					o.Log.Warn("failover skipped", "why", skipped[sys])
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("site bench: failover, run %d: %w", run, err)
				}
				failovers = append(failovers, s)
				res.Points = append(res.Points, failoverPoint(s, run))
				o.Log.Info("failover", "run", run, "seconds", report.Round(s.seconds, 3), "connections_reset", s.reset, "connections_stalled", s.stalled)
				continue
			}
			got, err := e.measureSystem(ctx, o, sys, run)
			if errors.Is(err, errSkip) {
				skipped[sys] = strings.TrimPrefix(err.Error(), errSkip.Error()+": ")
				o.Log.Warn("system skipped", "system", sys, "why", skipped[sys])
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("site bench: %s, run %d: %w", sys, run, err)
			}
			for conns, s := range got {
				runs[run-1][key(sys, conns)] = s
				p := report.Point{Scenario: "throughput", System: sys,
					Params: map[string]any{"connections": conns, "run": run, "seconds": o.Window.Seconds()},
					Metrics: map[string]float64{"gbps": report.Round(s.gbps, 3), "slowest_connection_gbps": report.Round(s.slowest, 3), "machine_cores": report.Round(s.machineCores, 3),
						"retransmitted_pct": report.Round(s.retransPct, 2)}}
				if s.gbps > 0 {
					p.Metrics["machine_cores_per_gbps"] = report.Round(s.machineCores/s.gbps, 3)
				}
				if sys == sysWGGo {
					p.Params["version"] = wgVersion
				}
				if s.gatewayCores > 0 {
					p.Metrics["gateway_cores"] = report.Round(s.gatewayCores, 3)
					p.Metrics["gateway_cores_per_gbps"] = report.Round(s.gatewayCores/s.gbps, 3)
				}
				res.Points = append(res.Points, p)
				o.Log.Info("throughput", "system", sys, "connections", conns, "run", run, "gbps", report.Round(s.gbps, 3), "machine_cores", report.Round(s.machineCores, 2))
			}
		}
	}
	for _, sys := range o.Systems {
		if why, ok := skipped[sys]; ok {
			res.Points = append(res.Points, report.Point{Scenario: "throughput", System: sys, Params: map[string]any{}, Metrics: map[string]float64{}, Skipped: why})
		}
	}
	if why, ok := skipped[scenarioFailover]; ok {
		res.Points = append(res.Points, report.Point{Scenario: scenarioFailover, System: sysGRE, Params: map[string]any{}, Metrics: map[string]float64{}, Skipped: why})
		res.SummaryText["failover"] = "skipped: " + why
	}
	res.Points = append(res.Points, paperPoints()...)
	summarize(res.Summary, runs)
	summarizeFailover(res.Summary, failovers)
	res.Notes = append(res.Notes, "load average at the end: "+loadAvg())
	if n, of := saturated(res); n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("in %d of %d points every core was busy: other work on the machine took what the systems left, so the whole machine's CPU per Gbit/s counts it too and overstates what the systems used", n, of))
	}
	if o.Out != "" {
		if err := write(res, o.Out, o); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// measureSystem brings sys up in a rig of its own, measures each
// connection count and takes it all down, whatever happened.
func (e *env) measureSystem(ctx context.Context, o Options, sys string, run int) (map[int]sample, error) {
	r, err := newRig()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := r.close(); err != nil {
			o.Log.Error("a namespace of the bench's is left behind: delete it with ip netns del", "error", err)
		}
	}()
	rs, err := e.start(ctx, sys, r)
	if err != nil {
		if sys == sysVXLAN && !errors.Is(err, errSkip) {
			// A kernel without VXLAN has no ceiling to offer.
			err = fmt.Errorf("%w: the kernel made no VXLAN device: %v", errSkip, err)
		}
		return nil, err
	}
	defer rs.stop()
	rc, err := listen(r)
	if err != nil {
		return nil, err
	}
	defer rc.close()
	if err := reachable(ctx, r, 20*time.Second); err != nil {
		return nil, err
	}
	pid := 0
	if rs.gateway != nil {
		pid = rs.gateway.cmd.Process.Pid
	}
	out := map[int]sample{}
	for _, conns := range Connections {
		var prof chan error
		if o.Profile != "" && (sys == sysGRE || sys == sysWG) && run == 1 {
			prof = make(chan error, 2)
			go func() {
				prof <- profile(ctx, r.gw, rs.admin, rs.adminCert, o.Warmup+o.Window, filepath.Join(o.Profile, fmt.Sprintf("%s-gateway-%dconn.pprof", sys, conns)))
			}()
			go func() {
				prof <- profile(ctx, r.ro, rs.admin, rs.officeCert, o.Warmup+o.Window, filepath.Join(o.Profile, fmt.Sprintf("%s-office-%dconn.pprof", sys, conns)))
			}()
		}
		s, err := measure(ctx, r, rc, conns, o.Warmup, o.Window, pid)
		if err != nil {
			return nil, fmt.Errorf("%d connections: %w", conns, err)
		}
		for range cap(prof) {
			if err := <-prof; err != nil {
				o.Log.Warn("CPU profile", "error", err)
			}
		}
		out[conns] = s
	}
	return out, nil
}

// profile saves a CPU profile of the deskway whose admin API listens
// on addr in namespace ns, serving the self-signed certificate in the
// file cert.
func profile(ctx context.Context, ns, addr, cert string, d time.Duration, path string) error {
	secs := int(d.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	pemBytes, err := os.ReadFile(cert)
	if err != nil {
		return fmt.Errorf("the gateway's admin certificate: %w", err)
	}
	blk, _ := pem.Decode(pemBytes)
	if blk == nil {
		return fmt.Errorf("the gateway's admin certificate %s holds no PEM block", cert)
	}
	// The certificate is pinned: it is the one deskway wrote for itself,
	// whatever names it carries.
	tc := &tls.Config{InsecureSkipVerify: true, VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 || !bytes.Equal(raw[0], blk.Bytes) {
			return errors.New("the admin API answered with another certificate than the gateway's")
		}
		return nil
	}}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		var c net.Conn
		err := inNS(ns, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, a)
			return err
		})
		return c, err
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://%s/debug/pprof/profile?seconds=%d", addr, secs), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// wireGuardGo finds wireguard-go's program: the one given, or the
// module proxy's latest version built with go install into the cache.
// Without it, why says why and the system is skipped.
func wireGuardGo(ctx context.Context, o Options) (path, version, why string) {
	if o.WireGuardGo != "" {
		if _, err := os.Stat(o.WireGuardGo); err != nil {
			return "", "", fmt.Sprintf("--wireguard-go %s: %v", o.WireGuardGo, err)
		}
		return o.WireGuardGo, "given: " + o.WireGuardGo, ""
	}
	if _, err := exec.LookPath("go"); err != nil {
		return "", "", "wireguard-go is built with the Go toolchain, and go is not installed"
	}
	cache := o.Cache
	if cache == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return "", "", fmt.Sprintf("no cache folder to build wireguard-go in: %v", err)
		}
		cache = filepath.Join(c, "deskway", "sitebench")
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", "", fmt.Sprintf("cache folder for wireguard-go: %v", err)
	}
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-json", wireGuardModule+"@latest")
	cmd.Dir = cache // outside any module
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Sprintf("the module proxy does not say which wireguard-go is the latest: %v", err)
	}
	var m struct{ Version string }
	if err := json.Unmarshal(out, &m); err != nil || m.Version == "" {
		return "", "", fmt.Sprintf("go list -m %s@latest: %q", wireGuardModule, out)
	}
	bin := filepath.Join(cache, "wireguard-go@"+m.Version)
	path = filepath.Join(bin, "wireguard")
	if _, err := os.Stat(path); err == nil {
		return path, m.Version, ""
	}
	cmd = exec.CommandContext(ctx, "go", "install", wireGuardModule+"@"+m.Version)
	cmd.Dir = cache
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", m.Version, fmt.Sprintf("go install %s@%s: %v: %s", wireGuardModule, m.Version, err, strings.TrimSpace(string(b)))
	}
	return path, m.Version, ""
}

// loadAvg is the machine's three load averages, named for the notes.
func loadAvg() string {
	la := report.LoadAverage()
	if la == "unknown" {
		return la
	}
	return la + " (1, 5 and 15 minutes)"
}

func key(sys string, conns int) string { return fmt.Sprintf("%s/%d", sys, conns) }

// saturated counts the measured points in which the whole machine was
// busy (95 % of every core or more), of all measured points.
func saturated(res *report.Result) (n, of int) {
	for _, p := range res.Points {
		c, ok := p.Metrics["machine_cores"]
		if !ok || p.System == "paper" {
			continue
		}
		of++
		if c >= 0.95*float64(res.Machine.CPUs) {
			n++
		}
	}
	return n, of
}
