// Package ttff measures xfreerdp's time to the first frame of an xrdp
// desktop, taking turns in one run: straight to xrdp, through a plain
// TCP hop (HAProxy in TCP mode) and through deskway's gateway on both
// transports with both authentications it offers xfreerdp. Every
// connection runs under strace, so the client's 100 ms waits (FreeRDP
// 2 waits that long whenever its read right after a request finds no
// reply yet) are counted beside each time.
package ttff

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/childproc"
)

// Options configure a run.
type Options struct {
	// Runs of each system, taking turns.
	Runs int
	// Traces, if set, is where each system's last trace is kept; with
	// Everything the client's reads and writes are traced too (slower:
	// for finding where a wait comes from, not for the times).
	Traces       string
	Everything   bool
	Out, Command string
	Log          *slog.Logger
}

// stageTimeout bounds one connection's wait for its first frame: it
// ends a run that hangs and judges no speed.
const stageTimeout = 2 * time.Minute

// Screen size of every client.
const screenW, screenH = 800, 600

// system is one way for xfreerdp to reach xrdp.
type system struct {
	name string
	// args are xfreerdp's, beside the host's credentials; port is where
	// it connects first.
	args func(r *rig) ([]string, error)
	port func(r *rig) int
}

// gateway is deskway's gateway on a transport (xfreerdp's /gt) with an
// authentication.
func gateway(transport, gt, auth string) system {
	return system{name: "deskway-" + transport + "-" + auth, port: func(r *rig) int { return r.gwPort },
		args: func(r *rig) ([]string, error) {
			a := []string{fmt.Sprintf("/v:127.0.0.1:%d", r.rdpPort), fmt.Sprintf("/g:127.0.0.1:%d", r.gwPort), "/gt:" + gt}
			if auth == "ntlm" {
				return append(a, "/gu:"+gatewayUser, "/gp:"+r.gwPass), nil
			}
			tok, err := r.token()
			return append(a, "/gat:"+tok), err
		}}
}

func systems() []system {
	return []system{
		{name: "direct", port: func(r *rig) int { return r.rdpPort },
			args: func(r *rig) ([]string, error) { return []string{fmt.Sprintf("/v:127.0.0.1:%d", r.rdpPort)}, nil }},
		{name: "haproxy-tcp", port: func(r *rig) int { return r.relayPort },
			args: func(r *rig) ([]string, error) { return []string{fmt.Sprintf("/v:127.0.0.1:%d", r.relayPort)}, nil }},
		gateway("websocket", "http", "paa"),
		gateway("websocket", "http", "ntlm"),
		gateway("legacy", "http,no-websockets", "paa"),
		gateway("legacy", "http,no-websockets", "ntlm"),
	}
}

// sample is one connection.
type sample struct {
	firstFrame time.Duration
	waits      waits
	// hsWaits are the 10 ms sleeps of FreeRDP's gateway handshake.
	hsWaits  waits
	connects int
	// gw is what the gateway's tunnel open line says, for deskway.
	gw gatewayTimes
}

// gatewayTimes are from the gateway's "tunnel open" line.
type gatewayTimes struct {
	// open is from accepting the client's first connection to the
	// channel open.
	open time.Duration
	// http, served and dial are the gateway's own working time in it:
	// answering the RDG requests (NTLM's rounds, the upgrade), handling
	// the TSGU handshake (request in hand to reply written, the dial
	// included) and the resource dial alone.
	http, served, dial time.Duration
}

// Run measures and writes the result when Out is set.
func Run(ctx context.Context, o Options) (*report.Result, error) {
	if o.Runs <= 0 {
		o.Runs = 5
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	res := &report.Result{Bench: "ttff", Command: o.Command, Started: time.Now().UTC(), Machine: report.ThisMachine(), Summary: map[string]float64{}}
	dir, err := os.MkdirTemp("", "deskway-ttff-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r := &rig{dir: dir}
	defer r.close()
	if err := r.setUp(); err != nil {
		return nil, err
	}
	load0 := report.LoadAverage()
	// The first connection starts the session (Xorg, the xterm), which
	// every measured one then reconnects to.
	o.Log.Info("starting the session")
	if _, err := measure(ctx, r, systems()[0], Options{}); err != nil {
		return nil, fmt.Errorf("ttff: first connection: %w", err)
	}
	runs := map[string][]sample{}
	all := systems()
	for run := 1; run <= o.Runs; run++ {
		k := (run - 1) % len(all)
		order := append(append([]system(nil), all[k:]...), all[:k]...)
		for _, sys := range order {
			s, err := measure(ctx, r, sys, o)
			if err != nil {
				return nil, fmt.Errorf("ttff: run %d, %s: %w", run, sys.name, err)
			}
			runs[sys.name] = append(runs[sys.name], s)
			m := map[string]float64{"first_frame_s": report.Round(s.firstFrame.Seconds(), 4), "waits_100ms": float64(s.waits.count),
				"wait_threads": float64(s.waits.threads), "waited_s": report.Round(s.waits.mainThread.Seconds(), 3), "tcp_connects": float64(s.connects),
				"waits_10ms": float64(s.hsWaits.count)}
			if s.gw.open > 0 {
				m["tunnel_open_s"] = report.Round(s.gw.open.Seconds(), 4)
				m["gateway_http_s"] = report.Round(s.gw.http.Seconds(), 5)
				m["gateway_served_s"] = report.Round(s.gw.served.Seconds(), 5)
				m["gateway_dial_s"] = report.Round(s.gw.dial.Seconds(), 5)
			}
			res.Points = append(res.Points, report.Point{Scenario: "first-frame", System: sys.name,
				Params: map[string]any{"run": run, "width": screenW, "height": screenH}, Metrics: m})
			o.Log.Info("run", "system", sys.name, "run", run, "first_frame_s", m["first_frame_s"], "waits_100ms", s.waits.count, "tunnel_open_s", m["tunnel_open_s"])
		}
	}
	summarize(res, runs)
	res.Notes = notes(o.Runs, load0, report.LoadAverage())
	if o.Out != "" {
		if err := write(res, o.Out); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// measure connects xfreerdp under strace by sys, waits for the xterm on
// its screen, and ends it.
func measure(ctx context.Context, r *rig, sys system, o Options) (sample, error) {
	var s sample
	args, err := sys.args(r)
	if err != nil {
		return s, err
	}
	x, root := r.x, r.root
	if navy(x, root) {
		return s, fmt.Errorf("the screen shows the xterm before %s connected: the measure would prove nothing", sys.name)
	}
	tracePath := filepath.Join(r.dir, "trace.txt")
	gwLogMark := len(r.gw.Output())
	calls := traceCalls
	if o.Everything {
		calls += ",poll,ppoll,select,pselect6,read,write,recvfrom,sendto,recvmsg,sendmsg"
	}
	cmd := append([]string{"-f", "-ttt", "-T", "--seccomp-bpf", "-e", "trace=" + calls, "-o", tracePath, "xfreerdp"},
		append(args, "/u:"+hostUser, "/p:"+r.hostPass, "/cert:ignore", fmt.Sprintf("/size:%dx%d", screenW, screenH), "/log-level:ERROR")...)
	p, err := childproc.Start([]string{"DISPLAY=" + r.display}, "strace", cmd...)
	if err != nil {
		return s, err
	}
	deadline := time.Now().Add(stageTimeout)
	for !navy(x, root) {
		select {
		case <-p.Exited():
			return s, fmt.Errorf("xfreerdp ended before its first frame:\n%s", p.Tail(20))
		case <-ctx.Done():
			p.Stop()
			return s, ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			p.Stop()
			return s, fmt.Errorf("xfreerdp showed no desktop in %s:\n%s", stageTimeout, p.Tail(20))
		}
		time.Sleep(2 * time.Millisecond)
	}
	seen := time.Now()
	p.Stop()
	// The window goes with the client: the next connection starts from
	// a blank screen.
	for navy(x, root) {
		if time.Since(seen) > stageTimeout {
			return s, fmt.Errorf("the xterm stayed on the screen after xfreerdp ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if o.Traces != "" {
		if b, err := os.ReadFile(tracePath); err == nil {
			_ = os.MkdirAll(o.Traces, 0o755)
			_ = os.WriteFile(filepath.Join(o.Traces, sys.name+".txt"), b, 0o644)
		}
	}
	f, err := os.Open(tracePath)
	if err != nil {
		return s, err
	}
	t, err := parseTrace(f)
	f.Close()
	if err != nil {
		return s, fmt.Errorf("reading the client's trace: %w", err)
	}
	if t.execve.IsZero() {
		return s, fmt.Errorf("the client's trace shows no start")
	}
	s.firstFrame = seen.Sub(t.execve)
	s.waits = t.sleeps(100*time.Millisecond, seen)
	s.hsWaits = t.sleeps(10*time.Millisecond, seen)
	s.connects = t.connects(sys.port(r), seen)
	if strings.HasPrefix(sys.name, "deskway-") {
		if s.gw, err = tunnelOpenTime(r, gwLogMark); err != nil {
			return s, err
		}
	}
	// xrdp notes the disconnect before the next client reconnects to
	// the session.
	time.Sleep(time.Second)
	return s, nil
}

// navy says whether row 60 of the screen shows the session's navy xterm.
func navy(x *xgb.Conn, root xproto.Window) bool {
	img, err := xproto.GetImage(x, xproto.ImageFormatZPixmap, xproto.Drawable(root), 0, 60, screenW, 1, 0xffffffff).Reply()
	if err != nil {
		return false
	}
	d := img.Data // 32 bits a pixel: blue, green, red, pad
	for i := 0; i+3 < len(d); i += 4 {
		if d[i+2] < 16 && d[i+1] < 16 && d[i] > 112 && d[i] < 144 {
			return true
		}
	}
	return false
}

// tunnelOpenTime reads the gateway's "tunnel open" line logged since
// mark and returns its times.
func tunnelOpenTime(r *rig, mark int) (gatewayTimes, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if t, ok := parseTunnelOpen(r.gw.Output()[mark:]); ok {
			return t, nil
		}
		if time.Now().After(deadline) {
			return gatewayTimes{}, fmt.Errorf("the gateway logged no tunnel open:\n%s", r.gw.Tail(10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// parseTunnelOpen finds the first "tunnel open" line in the gateway's
// JSON log.
func parseTunnelOpen(log string) (gatewayTimes, bool) {
	for _, line := range strings.Split(log, "\n") {
		var f struct {
			Msg      string  `json:"msg"`
			OpenMS   float64 `json:"open_ms"`
			HTTPMS   float64 `json:"http_ms"`
			ServedMS float64 `json:"served_ms"`
			DialMS   float64 `json:"dial_ms"`
		}
		if json.Unmarshal([]byte(line), &f) == nil && f.Msg == "tunnel open" {
			d := func(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
			return gatewayTimes{open: d(f.OpenMS), http: d(f.HTTPMS), served: d(f.ServedMS), dial: d(f.DialMS)}, true
		}
	}
	return gatewayTimes{}, false
}
