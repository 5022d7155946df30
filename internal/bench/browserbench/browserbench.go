// Package browserbench measures desktops opened in a browser tab against
// xfreerdp through the same gateway, on the same xrdp session, taking
// turns in one run: the time from the click to the first frame, the
// frames per second a client shows while a window moves, and the
// gateway's CPU per session (MS-TSGU for xfreerdp, RDCleanPath for the
// browser) for that same moving window.
package browserbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/deskway/deskway/internal/bench/procstat"
	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/config"
)

// Options configure a run.
type Options struct {
	// Runs of each client, taking turns.
	Runs int
	// Window is how long frames and CPU are counted while the window moves.
	Window time.Duration
	// Compression lists the gateway's browser_compression settings the
	// browser is measured with, each as a client of its own in every run;
	// the gateway restarts between them.
	Compression  []string
	Out, Command string
	Log          *slog.Logger
}

func (o *Options) defaults() {
	if o.Runs == 0 {
		o.Runs = 5
	}
	if o.Window == 0 {
		o.Window = 10 * time.Second
	}
	if len(o.Compression) == 0 {
		o.Compression = []string{config.BrowserCompressionContext, config.BrowserCompressionMessage, config.BrowserCompressionOff}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// stageTimeout bounds each step the bench waits on: a page to load, a
// first frame, the window to start moving. It ends a run that hangs and
// judges no speed: beside ten CPU hogs on two cores the browser's page
// took 10 s to load and its first frame 13 s more, and a machine running
// the whole test suite is slower still, where the minute these steps had
// ran out with nothing wrong.
const stageTimeout = 5 * time.Minute

// sample is one client's run.
type sample struct {
	// pageReady is the browser's: from Open in browser to its client loaded.
	pageReady  time.Duration
	firstFrame time.Duration
	fps        float64
	cpuPct     float64 // the gateway process, while the window moved
	bytes      uint64  // through the gateway in that time, both ways
	toClient   uint64  // sent to the client in that time, after compression
}

// Run measures and writes the result when Out is set.
func Run(ctx context.Context, o Options) (*report.Result, error) {
	o.defaults()
	for _, m := range o.Compression {
		if m != config.BrowserCompressionContext && m != config.BrowserCompressionMessage && m != config.BrowserCompressionOff {
			return nil, fmt.Errorf("browserbench: %q is not a browser_compression setting (off, no_context_takeover or context_takeover)", m)
		}
	}
	res := &report.Result{Bench: "browser", Command: o.Command, Started: time.Now().UTC(), Machine: report.ThisMachine(), Summary: map[string]float64{}}
	if o.Out != "" {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "deskway-browserbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r := &rig{dir: dir}
	defer r.close()
	if err := r.setUp(ctx, o.Compression[0]); err != nil {
		return nil, err
	}
	b, err := newBrowser(ctx, filepath.Join(dir, "chromium"))
	if err != nil {
		return nil, err
	}
	defer b.close()
	if err := b.signIn(r); err != nil {
		return nil, err
	}
	// The first connection starts the session (Xorg, the xterm): not what
	// either client is measured on. It also fixes the desktop size both use.
	o.Log.Info("starting the session")
	if _, err := b.connect(r, false, nil); err != nil {
		return nil, fmt.Errorf("browserbench: first browser connection: %w", err)
	}
	b.closeTab()
	time.Sleep(time.Second)
	runs := map[string][]sample{}
	for run := 1; run <= o.Runs; run++ {
		// Each browser setting and xfreerdp, the order turning each run.
		order := append([]string{"xfreerdp"}, o.Compression...)
		k := (run - 1) % len(order)
		order = append(order[k:], order[:k]...)
		for _, sys := range order {
			var s sample
			var err error
			// The last run's screens, while the window moves, show what each
			// client draws.
			shot := ""
			if o.Out != "" && run == o.Runs {
				shot = filepath.Join(o.Out, strings.TrimPrefix(sysName(sys), "deskway-")+"-moving.png")
			}
			if sys == "xfreerdp" {
				s, err = measureXfreerdp(ctx, r, o.Window, shot)
			} else if err = r.setCompression(sys); err == nil {
				s, err = b.measure(ctx, r, o.Window, shot)
			}
			if err != nil {
				return nil, fmt.Errorf("browserbench: run %d, %s: %w", run, sys, err)
			}
			runs[sys] = append(runs[sys], s)
			res.Points = append(res.Points, report.Point{Scenario: "desktop", System: sysName(sys),
				Params: map[string]any{"run": run, "width": r.desktopW, "height": r.desktopH, "window_s": o.Window.Seconds()},
				Metrics: map[string]float64{"first_frame_s": report.Round(s.firstFrame.Seconds(), 3), "fps": report.Round(s.fps, 3), "gateway_cpu_pct": report.Round(s.cpuPct, 3),
					"gateway_kbytes_per_s": report.Round(float64(s.bytes)/1024/o.Window.Seconds(), 3), "gateway_cpu_ms_per_mib": report.Round(cpuPerMiB(s, o.Window), 3),
					"to_client_kbytes_per_s": report.Round(float64(s.toClient)/1024/o.Window.Seconds(), 3)}})
			if sys != "xfreerdp" {
				res.Points[len(res.Points)-1].Metrics["page_ready_s"] = report.Round(s.pageReady.Seconds(), 3)
			}
			o.Log.Info("run", "system", sys, "run", run, "first_frame_s", report.Round(s.firstFrame.Seconds(), 3), "fps", report.Round(s.fps, 3), "gateway_cpu_pct", report.Round(s.cpuPct, 3))
			time.Sleep(time.Second) // xrdp notes the disconnect
		}
	}
	summarize(res, runs, o.Compression)
	res.Notes = []string{
		fmt.Sprintf("One xrdp host (Debian's xrdp and xorgxrdp), one deskway gateway process on its own (its CPU is read from /proc), and deskway's broker, agent and portal in another; %d runs of each client taking turns, all reconnecting to the same session of %dx%d, which the first (unmeasured) connection started. The browser is measured once for each gateway.browser_compression setting (%s) in every run, the gateway restarted with it before (no session is open then); the order of the clients turns each run.", o.Runs, r.desktopW, r.desktopH, strings.Join(o.Compression, ", ")),
		"Browser: Debian's chromium, headless, signed in to the portal; Open in browser, then the user name and password; the time runs from the click on Connect to the first animation frame in which the canvas shows the session's navy xterm (checked on every frame). xfreerdp: the .rdp file from the broker's launch, `xfreerdp FILE /u /p /gt:http /size:WxH` on Xvfb; the time runs from starting the process to the first poll (every 2 ms, X GetImage of one row) that finds the xterm on the Xvfb screen.",
		fmt.Sprintf("Frames: while the xterm moves itself 8 px every 30 ms (xterm's window operations) and scrolls a directory listing, for %s each client counts the changes of the xterm's right edge it shows: the browser in every animation frame of its canvas, xfreerdp's screen by X GetImage every 2 ms. gateway_cpu_pct is the gateway process's scheduler time (/proc/PID/task/*/schedstat, nanoseconds) over that window; gateway_kbytes_per_s what it relayed both ways and to_client_kbytes_per_s what it sent the client (the browser's after permessage-deflate), from its admin API's bytes_up, bytes_down and bytes_to_client.", o.Window),
		"The browser's time from clicking Open in browser on the portal to its client being loaded (the page and 6 MB of JavaScript with WebAssembly) is page_ready_s, beside the first-frame time, which starts at the click on Connect after the password is typed.",
		"Headlines are medians over runs; the ratios (bytes_ratio_tsgu, gateway_cpu_ratio_tsgu, first_frame_ratio) are medians of the per-run ratios (browser ÷ xfreerdp of the same run), with the worst run's beside them; keys without a suffix are the default setting's (context_takeover), the others end in the setting's name.",
	}
	if o.Out != "" {
		if err := write(res, o.Out, o.Compression); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// browser is one chromium, signed in to the portal.
type browser struct {
	ctx     context.Context
	cancels []context.CancelFunc
	tab     context.Context
	tabStop context.CancelFunc
}

func newBrowser(ctx context.Context, profile string) (*browser, error) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath("/usr/bin/chromium"),
		chromedp.NoSandbox,
		chromedp.Flag("ignore-certificate-errors", true),
		chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(profile),
	)
	actx, c1 := chromedp.NewExecAllocator(ctx, opts...)
	bctx, c2 := chromedp.NewContext(actx)
	b := &browser{ctx: bctx, cancels: []context.CancelFunc{c2, c1}}
	if err := chromedp.Do(bctx); err != nil {
		b.close()
		return nil, fmt.Errorf("starting chromium: %w", err)
	}
	return b, nil
}

func (b *browser) close() {
	b.closeTab()
	for _, c := range b.cancels {
		c()
	}
}

func (b *browser) closeTab() {
	if b.tabStop != nil {
		b.tabStop()
		b.tab, b.tabStop = nil, nil
	}
}

func (b *browser) signIn(r *rig) error {
	ctx, cancel := context.WithTimeout(b.ctx, stageTimeout)
	defer cancel()
	return chromedp.Do(ctx,
		chromedp.Navigate(r.portal+"/signin"),
		chromedp.WaitVisible(chromedp.ID("user")),
		chromedp.SendKeys(chromedp.ID("user"), benchUser),
		chromedp.SendKeys(chromedp.ID("password"), r.password),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")),
		chromedp.WaitVisible(chromedp.CSS("li.desktop[data-group='desk'] button[formaction='/browser']")),
	)
}

// firstFrameJS clicks Connect and resolves with the milliseconds until an
// animation frame in which the canvas shows the navy xterm, or rejects
// with what the page says once it shows the session ended (a refusal, a
// failed connection): that is no frame coming late.
const firstFrameJS = `new Promise((resolve, reject) => {
	const c = document.querySelector('iron-remote-desktop').shadowRoot.querySelector('canvas');
	const ended = document.getElementById('ended');
	const t0 = performance.now();
	document.querySelector('#credentials button').click();
	const poll = () => {
		if (!ended.hidden) {
			reject(new Error('the session ended before its first frame: ' + document.getElementById('status').textContent));
			return;
		}
		if (c.width > 100 && c.height > 100) {
			const d = c.getContext('2d', { willReadFrequently: true }).getImageData(0, 60, c.width, 1).data;
			for (let i = 0; i < d.length; i += 4) {
				if (d[i] < 16 && d[i+1] < 16 && d[i+2] > 112 && d[i+2] < 144) { resolve(performance.now() - t0); return; }
			}
		}
		requestAnimationFrame(poll);
	};
	requestAnimationFrame(poll);
})`

// connect opens the desktop in a new tab and returns the time from the
// click on Connect to the first frame showing the xterm.
func (b *browser) connect(r *rig, sized bool, ready *time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(b.ctx, stageTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(r.portal+"/"), chromedp.WaitVisible(chromedp.CSS("li.desktop[data-group='desk'] button[formaction='/browser']"))); err != nil {
		return 0, err
	}
	ch := chromedp.WaitNewTarget(b.ctx, func(i *target.Info) bool { return i.Type == "page" })
	clicked := time.Now()
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("li.desktop[data-group='desk'] button[formaction='/browser']"))); err != nil {
		return 0, err
	}
	var id target.ID
	select {
	case id = <-ch:
	case <-ctx.Done():
		return 0, errors.New("Open in browser opened no tab")
	}
	b.tab, b.tabStop = chromedp.NewContext(b.ctx, chromedp.WithTargetID(id))
	// The first action on a tab attaches to it for as long as its context
	// lives: attach on the tab's own context, not a timed one.
	if err := chromedp.Do(b.tab); err != nil {
		return 0, err
	}
	// The page's loading and the first frame each have a stage of their
	// own.
	tctx, cancel2 := context.WithTimeout(b.tab, stageTimeout)
	defer cancel2()
	if err := chromedp.Do(tctx,
		chromedp.WaitVisible(chromedp.CSS("#browser[data-ready='true'] #password")),
	); err != nil {
		return 0, fmt.Errorf("the desktop's page: %w", err)
	}
	if ready != nil {
		*ready = time.Since(clicked)
	}
	if err := chromedp.Do(tctx, chromedp.SendKeys(chromedp.ID("password"), r.password)); err != nil {
		return 0, err
	}
	fctx, cancel3 := context.WithTimeout(b.tab, stageTimeout)
	defer cancel3()
	ms, err := chromedp.Run(fctx, chromedp.Evaluate[float64](firstFrameJS, chromedp.EvalAwaitPromise))
	if err != nil {
		// What the page said (a refusal, an ended session) says why.
		sctx, cancel := context.WithTimeout(b.tab, 5*time.Second)
		defer cancel()
		// The ended panel's text is in the page from the start: it is
		// what the page says only once shown.
		said, _ := chromedp.Run(sctx, chromedp.Evaluate[string](`['status', 'ended'].map(id => document.getElementById(id)).filter(e => e && !e.hidden).map(e => e.textContent.trim()).join(' | ')`))
		return 0, fmt.Errorf("first frame: %w (the page says: %q)", err, strings.TrimSpace(said))
	}
	if !sized {
		w, err := chromedp.Run(fctx, chromedp.Evaluate[[]int](`(() => { const c = document.querySelector('iron-remote-desktop').shadowRoot.querySelector('canvas'); return [c.width, c.height]; })()`))
		if err != nil || len(w) != 2 {
			return 0, fmt.Errorf("canvas size: %v", err)
		}
		r.desktopW, r.desktopH = w[0], w[1]
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// edgesJS counts, for ms milliseconds, the changes of the xterm's right
// edge on row 60 of the canvas, checked in every animation frame. The
// right edge leads the move, so a client that leaves stale pixels behind
// the window is still seen to draw each new position.
const edgesJS = `new Promise((resolve) => {
	const c = document.querySelector('iron-remote-desktop').shadowRoot.querySelector('canvas');
	const ctx = c.getContext('2d', { willReadFrequently: true });
	const end = performance.now() + %d;
	let last = -2, changes = 0;
	const poll = () => {
		const d = ctx.getImageData(0, 60, c.width, 1).data;
		let edge = -1;
		for (let i = d.length - 4; i >= 0; i -= 4) {
			if (d[i] < 16 && d[i+1] < 16 && d[i+2] > 112 && d[i+2] < 144) { edge = i / 4; break; }
		}
		if (edge >= 0 && last >= 0 && edge !== last) changes++;
		if (edge >= 0) last = edge;
		if (performance.now() < end) { requestAnimationFrame(poll); } else { resolve(changes); }
	};
	requestAnimationFrame(poll);
})`

// edgeJS is the xterm's right edge on row 60 of the canvas, or -1.
const edgeJS = `(() => {
	const c = document.querySelector('iron-remote-desktop').shadowRoot.querySelector('canvas');
	const d = c.getContext('2d', { willReadFrequently: true }).getImageData(0, 60, c.width, 1).data;
	for (let i = d.length - 4; i >= 0; i -= 4) {
		if (d[i] < 16 && d[i+1] < 16 && d[i+2] > 112 && d[i+2] < 144) { return i / 4; }
	}
	return -1;
})()`

func (b *browser) measure(ctx context.Context, r *rig, window time.Duration, shot string) (sample, error) {
	var s sample
	var err error
	if s.firstFrame, err = b.connect(r, true, &s.pageReady); err != nil {
		return s, err
	}
	defer b.closeTab()
	edge := func() (int, error) {
		ectx, cancel := context.WithTimeout(b.tab, stageTimeout)
		defer cancel()
		return chromedp.Run(ectx, chromedp.Evaluate[int](edgeJS))
	}
	err = moving(ctx, r, window, &s, edge, func() (int, error) {
		tctx, cancel := context.WithTimeout(b.tab, window+stageTimeout)
		defer cancel()
		n, err := chromedp.Run(tctx, chromedp.Evaluate[int](fmt.Sprintf(edgesJS, window.Milliseconds()), chromedp.EvalAwaitPromise))
		if err == nil && shot != "" {
			png, serr := chromedp.Run(tctx, chromedp.FullScreenshot(90))
			if serr == nil {
				serr = os.WriteFile(shot, png, 0o644)
			}
			if serr != nil {
				return n, fmt.Errorf("screenshot: %w", serr)
			}
		}
		return n, err
	})
	return s, err
}

// moving starts the window moving and, once the client shows it moved
// (edge, the xterm's right edge it shows, leaves where it rested), lets
// count count the frames shown for window while the gateway's CPU and
// bytes are read, and stops it.
func moving(ctx context.Context, r *rig, window time.Duration, s *sample, edge, count func() (int, error)) error {
	rest, err := edge()
	if err != nil {
		return fmt.Errorf("the xterm's edge: %w", err)
	}
	if err := os.WriteFile(moveFlag, nil, 0o644); err != nil {
		return err
	}
	defer os.Remove(moveFlag)
	// The loop in the session polls the flag, and a loaded machine may
	// take long to run it: the window is measured once it moves.
	for deadline := time.Now().Add(stageTimeout); ; time.Sleep(10 * time.Millisecond) {
		e, err := edge()
		if err != nil {
			return fmt.Errorf("the xterm's edge: %w", err)
		}
		if e >= 0 && e != rest {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the window did not start moving within %s (its edge stayed at %d)", stageTimeout, e)
		}
	}
	a, err := procstat.ThreadsCPU(r.gatewayPID)
	if err != nil {
		return err
	}
	t0 := time.Now()
	b0, c0, err := r.gatewayBytes(ctx)
	if err != nil {
		return err
	}
	n, err := count()
	if err != nil {
		return fmt.Errorf("counting frames: %w", err)
	}
	b1, c1, err := r.gatewayBytes(ctx)
	if err != nil {
		return err
	}
	z, err := procstat.ThreadsCPU(r.gatewayPID)
	if err != nil {
		return err
	}
	s.fps = float64(n) / window.Seconds()
	s.cpuPct = 100 * (z - a).Seconds() / time.Since(t0).Seconds()
	s.bytes, s.toClient = b1-b0, c1-c0
	return nil
}

// measureXfreerdp connects xfreerdp with a fresh .rdp file from the
// broker and samples its screen on the Xvfb.
func measureXfreerdp(ctx context.Context, r *rig, window time.Duration, shot string) (sample, error) {
	var s sample
	rdp, err := r.launchRDP(ctx)
	if err != nil {
		return s, err
	}
	file := filepath.Join(r.dir, "desk.rdp")
	if err := os.WriteFile(file, []byte(rdp), 0o600); err != nil {
		return s, err
	}
	// Xvfb takes local clients without a cookie; xgb would log that it
	// found none.
	xgb.Logger.SetOutput(io.Discard)
	x, err := xgb.NewConnDisplay(r.display)
	if err != nil {
		return s, fmt.Errorf("X display %s: %w", r.display, err)
	}
	defer x.Close()
	root := xproto.Setup(x).DefaultScreen(x).Root
	// edge is the xterm's right edge on row 60 of the screen, or -1.
	edge := func() int {
		img, err := xproto.GetImage(x, xproto.ImageFormatZPixmap, xproto.Drawable(root), 0, 60, uint16(r.desktopW), 1, 0xffffffff).Reply()
		if err != nil {
			return -1
		}
		d := img.Data // 32 bits a pixel: blue, green, red, pad
		for i := len(d) - 4; i >= 0; i -= 4 {
			if d[i+2] < 16 && d[i+1] < 16 && d[i] > 112 && d[i] < 144 {
				return i / 4
			}
		}
		return -1
	}
	t0 := time.Now()
	p, err := childproc.Start([]string{"DISPLAY=" + r.display}, "xfreerdp", file, "/u:"+benchUser, "/p:"+r.password, "/cert:ignore", "/gt:http",
		fmt.Sprintf("/size:%dx%d", r.desktopW, r.desktopH), "/log-level:ERROR")
	if err != nil {
		return s, err
	}
	defer p.Stop()
	for edge() < 0 {
		if time.Since(t0) > stageTimeout {
			return s, fmt.Errorf("xfreerdp showed no desktop in %s:\n%s", stageTimeout, p.Tail(20))
		}
		time.Sleep(2 * time.Millisecond)
	}
	s.firstFrame = time.Since(t0)
	err = moving(ctx, r, window, &s, func() (int, error) { return edge(), nil }, func() (int, error) {
		end := time.Now().Add(window)
		last, changes := -2, 0
		for time.Now().Before(end) {
			e := edge()
			if e >= 0 && last >= 0 && e != last {
				changes++
			}
			if e >= 0 {
				last = e
			}
			time.Sleep(2 * time.Millisecond)
		}
		if shot != "" {
			out, err := exec.Command("import", "-display", r.display, "-window", "root", "-crop", fmt.Sprintf("%dx%d+0+0", r.desktopW, r.desktopH), shot).CombinedOutput()
			if err != nil {
				return changes, fmt.Errorf("screenshot: %v %s", err, out)
			}
		}
		return changes, nil
	})
	return s, err
}
