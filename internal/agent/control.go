package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Controller carries out an administrator's session commands on this
// host. Each method acts on the named user's session.
type Controller interface {
	Logoff(ctx context.Context, user string) error
	Disconnect(ctx context.Context, user string) error
	Message(ctx context.Context, user, text string) error
}

// XRDP controls the xrdp sessions XRDPSessions finds, the way an xrdp
// host ends them itself: a logoff asks the session's window manager to
// quit, after which xrdp-sesman stops the X server; a disconnect runs
// xrdp-dis in the session; a message is an xmessage window on its
// display. The agent must run as root to act for the session's user.
type XRDP struct {
	// Proc is the /proc to read sessions from.
	Proc string
	// Grace is how long a session's programs have to quit at a logoff
	// before they are stopped (default 15 s).
	Grace time.Duration
}

func (x *XRDP) proc() string {
	if x.Proc == "" {
		return "/proc"
	}
	return x.Proc
}

func (x *XRDP) grace() time.Duration {
	if x.Grace <= 0 {
		return 15 * time.Second
	}
	return x.Grace
}

// find returns name's xrdp session.
func (x *XRDP) find(name string) (xrdpSession, error) {
	all, err := scanXRDP(x.proc())
	if err != nil {
		return xrdpSession{}, err
	}
	var mine []xrdpSession
	for _, s := range all {
		if s.user == name {
			mine = append(mine, s)
		}
	}
	switch len(mine) {
	case 0:
		return xrdpSession{}, fmt.Errorf("user %q has no xrdp session on this host", name)
	case 1:
		return mine[0], nil
	}
	// xrdp gives a user one session; more means a policy allowing several,
	// and acting on a guess could end the wrong one.
	return xrdpSession{}, fmt.Errorf("user %q has %d xrdp sessions on this host; act on it there", name, len(mine))
}

// Logoff ends name's session: its window manager gets SIGTERM, as at a
// shutdown, and xrdp-sesman then stops the X server and the channel
// server. Programs still running after the grace get SIGTERM, then
// SIGKILL; so do programs that left the session's process tree but kept
// its display (daemons a desktop starts). A program that left both (a
// daemon started without the display) is not found.
func (x *XRDP) Logoff(ctx context.Context, name string) error {
	s, err := x.find(name)
	if err != nil {
		return err
	}
	// Only the session user's own processes are ever signalled (never the
	// root session manager or a set-uid child), each by its pid and start
	// time, so a pid reused meanwhile is left alone.
	tree := x.owned(x.descendants(s.sesman), s.uid)
	xs := x.ident(s.xserver)
	var wm []proc
	for _, p := range x.owned(x.children(s.sesman), s.uid) {
		if p.pid != s.xserver && x.comm(p.pid) != "xrdp-chansrv" {
			wm = append(wm, p)
		}
	}
	if len(wm) == 0 {
		wm = []proc{xs} // no window manager left: the X server ends the session
	}
	x.signal(wm, syscall.SIGTERM)
	if x.waitGone(ctx, []proc{xs}, x.grace()) {
		x.sweep(ctx, s, tree)
		return nil
	}
	rest := append(x.owned(x.descendants(s.sesman), s.uid), xs)
	x.signal(rest, syscall.SIGTERM)
	if !x.waitGone(ctx, rest, 5*time.Second) {
		x.signal(rest, syscall.SIGKILL)
		if !x.waitGone(ctx, rest, 5*time.Second) {
			return fmt.Errorf("the X server of %s's session (pid %d) survived SIGKILL", name, s.xserver)
		}
	}
	x.sweep(ctx, s, tree)
	return nil
}

// proc is a process by its pid and start time (field 22 of its stat).
type proc struct {
	pid   int
	start string
}

// ident is pid with its start time now.
func (x *XRDP) ident(pid int) proc { return proc{pid: pid, start: x.startTime(pid)} }

// startTime is pid's start time in clock ticks since boot, "" if gone.
func (x *XRDP) startTime(pid int) string {
	st, err := procStat(x.proc(), pid)
	if err != nil {
		return ""
	}
	return strconv.FormatUint(st.Starttime, 10)
}

// owned keeps the processes of pids that run as uid.
func (x *XRDP) owned(pids []int, uid string) []proc {
	var out []proc
	for _, pid := range pids {
		if x.uidOf(pid) == uid {
			out = append(out, x.ident(pid))
		}
	}
	return out
}

// same reports whether p still runs as the process it was.
func (x *XRDP) same(p proc) bool {
	return p.start != "" && x.startTime(p.pid) == p.start && x.alive(p.pid)
}

func (x *XRDP) signal(ps []proc, sig syscall.Signal) {
	for _, p := range ps {
		if x.same(p) {
			_ = syscall.Kill(p.pid, sig)
		}
	}
}

// sweep stops the user's programs that outlived the session: those of
// its process tree, and any other with the session's display.
func (x *XRDP) sweep(ctx context.Context, s xrdpSession, tree []proc) {
	var left []proc
	for _, p := range tree {
		if x.same(p) {
			left = append(left, p)
		}
	}
	ents, _ := os.ReadDir(x.proc())
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || x.uidOf(pid) != s.uid {
			continue
		}
		env, _ := os.ReadFile(filepath.Join(x.proc(), e.Name(), "environ"))
		for _, kv := range bytes.Split(env, []byte{0}) {
			if d, ok := bytes.CutPrefix(kv, []byte("DISPLAY=:")); ok && strings.Split(string(d), ".")[0] == s.display {
				left = append(left, x.ident(pid))
				break
			}
		}
	}
	if len(left) == 0 {
		return
	}
	x.signal(left, syscall.SIGTERM)
	if !x.waitGone(ctx, left, 3*time.Second) {
		x.signal(left, syscall.SIGKILL)
	}
}

// Disconnect drops the client of name's session with xrdp-dis, xrdp's
// own disconnect tool, run in the session; the session runs on.
func (x *XRDP) Disconnect(ctx context.Context, name string) error {
	s, err := x.find(name)
	if err != nil {
		return err
	}
	if !s.connected {
		return fmt.Errorf("%s's session is already disconnected", name)
	}
	run, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd, err := x.asUser(run, s, "xrdp-dis")
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("xrdp-dis: %w: %s", err, strings.TrimSpace(string(out)))
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		now, err := x.find(name)
		if err != nil {
			return fmt.Errorf("%s's session ended at the disconnect", name)
		}
		if !now.connected {
			return nil
		}
	}
	return fmt.Errorf("xrdp-dis ran but %s's client is still connected", name)
}

// Message shows text in name's session in an xmessage window, which
// stays until the user closes it (at most an hour).
func (x *XRDP) Message(ctx context.Context, name, text string) error {
	s, err := x.find(name)
	if err != nil {
		return err
	}
	// The text goes in on stdin: on the command line, words of it could
	// be taken for X toolkit options.
	cmd, err := x.asUser(context.WithoutCancel(ctx), s, "xmessage", "-center", "-title", "Message from your administrator", "-file", "-")
	if err != nil {
		return err
	}
	cmd.Stdin = strings.NewReader(text)
	var out bytes.Buffer
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("xmessage: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// A window that fails (no display, no authority) does so at once.
	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("xmessage: %w: %s", err, strings.TrimSpace(out.String()))
		}
		return nil // closed already
	case <-time.After(time.Second):
	}
	go func() {
		select {
		case <-exited:
		case <-time.After(time.Hour):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	return nil
}

// asUser builds prog args to run as s's user on s's display.
func (x *XRDP) asUser(ctx context.Context, s xrdpSession, prog string, args ...string) (*exec.Cmd, error) {
	path, err := exec.LookPath(prog)
	if err != nil {
		return nil, fmt.Errorf("%s is not installed on this host (Debian: apt install %s): %w", prog, debianPackage(prog), err)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	if err := x.prepare(cmd, s); err != nil {
		return nil, err
	}
	return cmd, nil
}

// debianPackage names the package that ships a program the agent runs.
func debianPackage(prog string) string {
	if prog == "xmessage" {
		return "x11-utils"
	}
	return "xrdp"
}

// prepare sets cmd to run as s's user, in a session of its own, with the
// environment of s's X server: its display, authority and xrdp sockets.
func (x *XRDP) prepare(cmd *exec.Cmd, s xrdpSession) error {
	u, err := user.LookupId(s.uid)
	if err != nil {
		return fmt.Errorf("the session's user %s: %w", s.uid, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	var groups []uint32
	if ids, err := u.GroupIds(); err == nil {
		for _, g := range ids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				groups = append(groups, uint32(n))
			}
		}
	}
	if os.Geteuid() != 0 && uint64(os.Geteuid()) != uid {
		return errors.New("the agent runs as another user than the session's and is not root: it cannot act in the session")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}}
	env := map[string]string{"XRDP_SOCKET_PATH": "/run/xrdp/sockdir"}
	xenv, _ := os.ReadFile(filepath.Join(x.proc(), strconv.Itoa(s.xserver), "environ"))
	for _, kv := range bytes.Split(xenv, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok && (k == "XRDP_SOCKET_PATH" || k == "XAUTHORITY" || k == "LANG") {
			env[k] = v
		}
	}
	if _, ok := env["XAUTHORITY"]; !ok {
		env["XAUTHORITY"] = filepath.Join(u.HomeDir, ".Xauthority") // where xrdp-sesman writes it
	}
	cmd.Env = []string{"DISPLAY=:" + s.display, "HOME=" + u.HomeDir, "USER=" + u.Username, "LOGNAME=" + u.Username,
		"PATH=/usr/local/bin:/usr/bin:/bin"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = u.HomeDir
	return nil
}

// children lists the pids whose parent is pid.
func (x *XRDP) children(pid int) []int {
	var out []int
	ents, _ := os.ReadDir(x.proc())
	want := strconv.Itoa(pid)
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join(x.proc(), e.Name(), "status"))
		if err == nil && statusField(st, "PPid:") == want {
			n, _ := strconv.Atoi(e.Name())
			out = append(out, n)
		}
	}
	return out
}

// descendants lists pid's process tree below it.
func (x *XRDP) descendants(pid int) []int {
	var out []int
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		kids := x.children(queue[0])
		out = append(out, kids...)
		queue = append(queue, kids...)
	}
	return out
}

func (x *XRDP) comm(pid int) string {
	b, _ := os.ReadFile(filepath.Join(x.proc(), strconv.Itoa(pid), "comm"))
	return strings.TrimSpace(string(b))
}

func (x *XRDP) uidOf(pid int) string {
	st, err := os.ReadFile(filepath.Join(x.proc(), strconv.Itoa(pid), "status"))
	if err != nil {
		return ""
	}
	return statusField(st, "Uid:")
}

// alive reports whether pid runs (a zombie has ended).
func (x *XRDP) alive(pid int) bool {
	st, err := os.ReadFile(filepath.Join(x.proc(), strconv.Itoa(pid), "status"))
	return err == nil && !strings.HasPrefix(statusField(st, "State:"), "Z")
}

// waitGone waits up to d for every process to end.
func (x *XRDP) waitGone(ctx context.Context, ps []proc, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; {
		left := false
		for _, p := range ps {
			if x.same(p) {
				left = true
				break
			}
		}
		if !left {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
