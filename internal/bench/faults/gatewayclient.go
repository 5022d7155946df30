package faults

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/childproc"
)

// gwClient is one user's xfreerdp, on an Xvfb of its own, and the frames
// its screen showed.
type gwClient struct {
	user, transport string
	xvfb            *childproc.Proc
	display         string
	proc            *childproc.Proc
	x               *xgb.Conn
	// args are xfreerdp's, to start it again after a lost session.
	args []string

	mu     sync.Mutex
	frames []time.Time
	// pixel is the sampled pixel's last value, and watchErr why watch
	// stopped sampling before its context ended: what a client that did
	// not come back showed.
	pixel    [3]byte
	watchErr error
}

// connect starts user i's client, half of them on each transport, with
// the .rdp file the broker hands out for a placement on the host through
// the farm's address, and waits for its first frame.
func (r *gwRig) connect(ctx context.Context, i int, timeout time.Duration) (*gwClient, error) {
	name := r.users[i]
	c := &gwClient{user: name, transport: "websocket"}
	gt := "http"
	if i%2 == 1 {
		c.transport, gt = "legacy", "http,no-websockets"
	}
	file, err := r.launch(name)
	if err != nil {
		return nil, err
	}
	n := firstClientDisplay + i
	childproc.RemoveStaleX(n, n)
	c.display = fmt.Sprintf(":%d", n)
	if c.xvfb, err = childproc.Start(nil, "Xvfb", c.display, "-screen", "0", fmt.Sprintf("%dx%dx24", screenW, screenH), "-nolisten", "tcp"); err != nil {
		return nil, err
	}
	// Xvfb takes local clients without a cookie; xgb would log that it
	// found none. Its socket may exist a moment before it listens.
	xgb.Logger.SetOutput(io.Discard)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c.x, err = xgb.NewConnDisplay(c.display); err == nil {
			break
		}
		if time.Now().After(deadline) {
			c.xvfb.Stop()
			return nil, fmt.Errorf("faults: Xvfb %s did not start: %w: %s", c.display, err, c.xvfb.Tail(5))
		}
	}
	go c.watch(ctx)
	// The log level shows FreeRDP's reconnect attempts.
	c.args = []string{file, "/u:" + name, "/p:" + r.password, "/cert:ignore",
		"/gt:" + gt, fmt.Sprintf("/size:%dx%d", screenW, screenH), "/bpp:24", "-wallpaper", "-themes", "/log-level:INFO"}
	if err := c.start(ctx, timeout); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// launch writes the .rdp file the broker would answer name's launch
// with: the host through the farm's address, with a fresh token (as
// `deskway token` mints it), and returns its path.
func (r *gwRig) launch(name string) (string, error) {
	out, err := exec.Command(r.env.Bin, "token", "-c", r.nodes[0].cfg, "--user", name, "--groups", "faults",
		"--host", "127.0.0.1", "--port", strconv.Itoa(r.rdpPort), "--ttl", "30m").Output()
	if err != nil {
		return "", fmt.Errorf("deskway token: %w", err)
	}
	file := filepath.Join(r.dir, name+".rdp")
	rdp := broker.RDPFile("127.0.0.1", r.rdpPort, r.lbAddr, strings.TrimSpace(string(out)), name)
	if err := os.WriteFile(file, []byte(rdp), 0o600); err != nil {
		return "", err
	}
	return file, nil
}

// start starts the client's xfreerdp and waits for two frames.
func (c *gwClient) start(ctx context.Context, timeout time.Duration) error {
	// Line-buffered, so that its log (FreeRDP's reconnect attempts
	// among it) is read as it happens, not when a pipe's buffer fills.
	p, err := childproc.Start([]string{"DISPLAY=" + c.display}, "stdbuf", append([]string{"-oL", "-eL", "xfreerdp"}, c.args...)...)
	if err != nil {
		return err
	}
	c.proc = p
	from := time.Now()
	for {
		if _, after := c.framesSince(from); len(after) >= 2 {
			return nil
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("faults: %s's xfreerdp ended before its desktop showed: %s", c.user, p.Tail(8))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Since(from) > timeout {
			return fmt.Errorf("faults: %s's desktop showed no frame within %v: %s", c.user, timeout, p.Tail(8))
		}
	}
}

// exited says whether the client's xfreerdp has ended.
func (c *gwClient) exited() bool {
	select {
	case <-c.proc.Exited():
		return true
	default:
		return false
	}
}

// watch samples one pixel of the client's screen every 20 ms and
// records a frame each time it shows the session's background in
// another colour, until ctx ends or the X server goes.
func (c *gwClient) watch(ctx context.Context) {
	root := xproto.Setup(c.x).DefaultScreen(c.x).Root
	last := -1
	for ctx.Err() == nil {
		// Right of the xterm's short lines, so always background.
		img, err := xproto.GetImage(c.x, xproto.ImageFormatZPixmap, xproto.Drawable(root), screenW-20, screenH/2, 1, 1, 0xffffffff).Reply()
		if err != nil {
			c.mu.Lock()
			c.watchErr = err
			c.mu.Unlock()
			return
		}
		if d := img.Data; len(d) >= 4 {
			c.mu.Lock()
			c.pixel = [3]byte{d[2], d[1], d[0]}
			if near(d[2], 0x20) && near(d[1], 0x40) && (last < 0 || absDiff(int(d[0]), last) > 12) {
				last = int(d[0])
				c.frames = append(c.frames, time.Now())
			}
			c.mu.Unlock()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func near(v, want byte) bool { return absDiff(int(v), int(want)) <= 12 }

func absDiff(a, b int) int {
	if a > b {
		return a - b
	}
	return b - a
}

// framesSince is the frames from t on, and the last one before t.
func (c *gwClient) framesSince(t time.Time) (before time.Time, after []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, _ := slices.BinarySearchFunc(c.frames, t, func(a, b time.Time) int { return a.Compare(b) })
	if i > 0 {
		before = c.frames[i-1]
	}
	return before, slices.Clone(c.frames[i:])
}

// shot saves the client's screen as a PNG at path, for a client that
// did not come back: what its user sees.
func (c *gwClient) shot(path string) error {
	root := xproto.Setup(c.x).DefaultScreen(c.x).Root
	img, err := xproto.GetImage(c.x, xproto.ImageFormatZPixmap, xproto.Drawable(root), 0, 0, screenW, screenH, 0xffffffff).Reply()
	if err != nil {
		return fmt.Errorf("faults: %s's screen: %w", c.user, err)
	}
	out := image.NewRGBA(image.Rect(0, 0, screenW, screenH))
	for i := 0; i+3 < len(img.Data) && i/4 < screenW*screenH; i += 4 {
		p := i / 4
		out.Set(p%screenW, p/screenW, color.RGBA{R: img.Data[i+2], G: img.Data[i+1], B: img.Data[i], A: 255})
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, out)
}

// sampled says what watch last saw of the client's screen, for a client
// that did not come back: the pixel it samples (the desktop's
// background is #2040xx), and the error that stopped it, if one did.
func (c *gwClient) sampled() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := fmt.Sprintf("last pixel #%02x%02x%02x, %d frames in all", c.pixel[0], c.pixel[1], c.pixel[2], len(c.frames))
	if c.watchErr != nil {
		s += fmt.Sprintf("; sampling stopped: %v", c.watchErr)
	}
	return s
}

// reconnects counts FreeRDP's reconnect attempts so far.
func (c *gwClient) reconnects() int {
	return strings.Count(c.proc.Output(), "Attempting reconnect")
}

func (c *gwClient) close() {
	if c.proc != nil {
		c.proc.Stop()
	}
	if c.x != nil {
		c.x.Close()
	}
	c.xvfb.Stop()
}

// reconnectedIn says whether the log FreeRDP wrote after the first from
// bytes shows a reconnect attempt followed by a dynamic channel loaded:
// FreeRDP loads its channels once the connection sequence through the
// gateway to the session host is done, before the host's session
// manager logs the user back on to their desktop.
func reconnectedIn(log string, from int) bool {
	if from > len(log) {
		return false
	}
	_, after, ok := strings.Cut(log[from:], "Attempting reconnect")
	return ok && strings.Contains(after, "Loading Dynamic Virtual Channel")
}
