package testkit

import (
	"bytes"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/childproc"
	"github.com/prometheus/procfs"
)

// Require stops the test when a program is missing: a skip on a
// developer's machine, a failure in CI, where every real peer must run.
func Require(t testing.TB, programs ...string) {
	t.Helper()
	var missing []string
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return
	}
	missingThing(t, strings.Join(missing, ", "))
}

// missingThing skips outside CI and fails in CI, where every real peer
// must run.
func missingThing(t testing.TB, what string) {
	t.Helper()
	msg := fmt.Sprintf("missing %s (make deps installs them)", what)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// RequireRoot is Require for tests that must run as root (xrdp's session
// manager logs users in through PAM).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("this test starts xrdp and must run as root")
	}
	t.Skip("needs root to start xrdp")
}

// Process is a started helper program, stopped at test end with its group.
type Process struct {
	Cmd *exec.Cmd
	Log *Buffer
}

// Buffer is a bytes.Buffer safe to read while a process writes to it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Start runs name with args in its own process group; it is killed at test end.
func Start(t testing.TB, env []string, name string, args ...string) *Process {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	log := &Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		// The command may end before what it started: make run's shell
		// exits at once while deskway shuts down, still holding its
		// ports, and a test taking the ports' lock next found them in use.
		waitGroupGone(cmd.Process.Pid)
		if t.Failed() {
			t.Logf("--- output of %s:\n%s", name, tail(log.String(), 4000))
		}
	})
	return &Process{Cmd: cmd, Log: log}
}

// waitGroupGone waits until no live process is left in process group
// pgid, killing what is left after 5 s, and gives up after 10 s (a
// process may have left the group's session for one of its own).
// Zombies count as gone: they hold no ports or files.
func waitGroupGone(pgid int) {
	begun := time.Now()
	for groupAlive(pgid) {
		switch waited := time.Since(begun); {
		case waited > 10*time.Second:
			return
		case waited > 5*time.Second:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// groupAlive reports whether a process of group pgid is running (not a
// zombie), from /proc.
func groupAlive(pgid int) bool {
	procs, _ := procfs.AllProcs()
	for _, p := range procs {
		if st, err := p.Stat(); err == nil && st.PGRP == pgid && st.State != "Z" {
			return true
		}
	}
	return false
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// Xvfb starts a virtual X display and returns its DISPLAY value.
func Xvfb(t testing.TB) string {
	t.Helper()
	Require(t, "Xvfb")
	childproc.RemoveStaleX(90, 139)
	for n := 90; n < 140; n++ {
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X11-unix/X%d", n)); err == nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X%d-lock", n)); err == nil {
			continue
		}
		disp := fmt.Sprintf(":%d", n)
		p := Start(t, nil, "Xvfb", disp, "-screen", "0", "1280x800x24", "-nolisten", "tcp")
		switch xvfbServes(p, n) {
		case "ours":
			return disp
		case "another":
			// Another test's X server took n first (ours exits:
			// "server already active"): try the next.
			_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
			continue
		}
		t.Fatalf("Xvfb %s did not start", disp)
	}
	t.Fatal("no free X display number")
	return ""
}

// xvfbServes waits up to 5 s for display n's socket and says whose
// server has it: "ours" if the lock file, which the one server that gets
// the display writes, names p (the Xvfb started on n), "another" if it
// names another, "" if no server came.
func xvfbServes(p *Process, n int) string {
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(fmt.Sprintf("/tmp/.X11-unix/X%d", n)); err == nil {
			b, _ := os.ReadFile(fmt.Sprintf("/tmp/.X%d-lock", n))
			if strings.TrimSpace(string(b)) == strconv.Itoa(p.Cmd.Process.Pid) {
				return "ours"
			}
			return "another"
		}
		time.Sleep(50 * time.Millisecond)
	}
	return ""
}

// Screenshot grabs the whole X display.
func Screenshot(t testing.TB, display, saveAs string) image.Image {
	t.Helper()
	out, err := exec.Command("import", "-display", display, "-window", "root", "png:-").Output()
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("screenshot decode: %v", err)
	}
	if saveAs != "" {
		_ = os.MkdirAll(filepath.Dir(saveAs), 0o755)
		_ = os.WriteFile(saveAs, out, 0o644)
	}
	return img
}

// CountColor counts pixels of exactly r, g, b (8-bit).
func CountColor(img image.Image, r, g, b uint8) int {
	n := 0
	bd := img.Bounds()
	for y := bd.Min.Y; y < bd.Max.Y; y++ {
		for x := bd.Min.X; x < bd.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			if uint8(cr>>8) == r && uint8(cg>>8) == g && uint8(cb>>8) == b {
				n++
			}
		}
	}
	return n
}

// XRDP is a running xrdp with its session manager, serving one local user
// whose desktop is a navy xterm (a color nothing else on screen has).
type XRDP struct {
	Addr, User, Password string
	// NS is the namespace xrdp, sesman and the sessions run in; a deskway
	// agent that reads them runs there too (NS.Start).
	NS *XRDPNamespace
	// xrdp is the listener's process and cfg its xrdp.ini, for Stop and
	// Restart.
	xrdp *Process
	cfg  string
	t    testing.TB
}

// Stop ends xrdp's listener (its session manager and sessions stay), as
// a crashed or stopped RDP service would, and waits until the port no
// longer accepts connections.
func (x *XRDP) Stop() {
	x.t.Helper()
	_ = syscall.Kill(-x.xrdp.Cmd.Process.Pid, syscall.SIGKILL)
	_ = x.xrdp.Cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); WaitPort(x.Addr, 50*time.Millisecond) == nil; {
		if time.Now().After(deadline) {
			x.t.Fatalf("%s still accepts connections after xrdp was stopped", x.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Restart starts the listener Stop ended and waits for its port.
func (x *XRDP) Restart() {
	x.t.Helper()
	x.xrdp = x.NS.Start(x.t, nil, "xrdp", "--nodaemon", "--config", x.cfg)
	if err := WaitPort(x.Addr, 10*time.Second); err != nil {
		x.t.Fatal(err)
	}
}

// DesktopColor is the xterm background the test desktop shows: navy.
var DesktopColor = [3]uint8{0, 0, 128}

// StartXRDP starts xrdp-sesman and xrdp of setup, xrdp on
// 127.0.0.1:port, with the setup's test user, in a namespace of the
// setup's (NewXRDPNamespace: its lock is held for the rest of t).
func StartXRDP(t testing.TB, setup XRDPSetup, port int) *XRDP {
	t.Helper()
	Require(t, "xrdp", "xrdp-sesman", "xterm", "useradd", "chpasswd")
	ns := NewXRDPNamespace(t, setup)
	x := &XRDP{Addr: fmt.Sprintf("127.0.0.1:%d", port), User: setup.User, Password: "Xrdp-Pass1", NS: ns}
	if _, err := user.Lookup(x.User); err != nil {
		run(t, "useradd", "-m", "-s", "/bin/bash", x.User)
	}
	cp := exec.Command("chpasswd")
	cp.Stdin = strings.NewReader(x.User + ":" + x.Password + "\n")
	if out, err := cp.CombinedOutput(); err != nil {
		t.Fatalf("chpasswd: %v %s", err, out)
	}
	home := "/home/" + x.User
	wm := "#!/bin/sh\nexec xterm -geometry 80x24+10+10 -bg navy -fg white -e 'echo DESKWAY-E2E; sleep 3600'\n"
	if err := os.WriteFile(home+"/startwm.sh", []byte(wm), 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "chown", x.User, home+"/startwm.sh")
	// Leftovers of an earlier run would be reconnected to; start clean.
	_ = exec.Command("pkill", "-KILL", "-u", x.User).Run()
	if !setup.private {
		// Left by an xrdp killed earlier, a pid file stops the next
		// from starting (a private setup's /run/xrdp is new).
		if err := childproc.PrepareXRDPSocketDir("/var/run/xrdp/sockdir"); err != nil {
			t.Fatal(err)
		}
		_ = os.Remove("/var/run/xrdp/xrdp-sesman.pid")
		_ = os.Remove("/var/run/xrdp/xrdp.pid")
	}
	ini, err := os.ReadFile("/etc/xrdp/xrdp.ini")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := regexp.MustCompile(`(?m)^port=3389\s*$`).ReplaceAllString(string(ini), "port=tcp://"+x.Addr)
	if setup.private {
		cfg = regexp.MustCompile(`(?m)^LogFile=.*$`).ReplaceAllLiteralString(cfg, "LogFile="+filepath.Join(dir, "xrdp.log"))
		t.Cleanup(func() {
			if t.Failed() {
				b, _ := os.ReadFile(filepath.Join(dir, "xrdp.log"))
				t.Logf("--- xrdp.log of the setup on port %d:\n%s", setup.SesmanPort, tail(string(b), 4000))
			}
		})
	}
	cfgPath := filepath.Join(dir, "xrdp.ini")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	// sesman binds its port on 127.0.0.1 or ::1 depending on the build.
	sesman := []string{fmt.Sprintf("127.0.0.1:%d", setup.SesmanPort), fmt.Sprintf("[::1]:%d", setup.SesmanPort)}
	for _, a := range sesman {
		if err := WaitPort(a, 100*time.Millisecond); err == nil {
			t.Fatalf("a session manager already listens on %s; stop it first", a)
		}
	}
	ns.Start(t, nil, "xrdp-sesman", "--nodaemon")
	x.t, x.cfg = t, cfgPath
	x.xrdp = ns.Start(t, nil, "xrdp", "--nodaemon", "--config", cfgPath)
	t.Cleanup(func() {
		_ = exec.Command("pkill", "-KILL", "-u", x.User).Run()
	})
	if err := WaitPort(x.Addr, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := WaitPort(sesman[0], 5*time.Second); err != nil {
		if err := WaitPort(sesman[1], 5*time.Second); err != nil {
			t.Fatalf("xrdp-sesman did not open port %d", setup.SesmanPort)
		}
	}
	return x
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v %s", name, args, err, out)
	}
}
