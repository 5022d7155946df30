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
	for _, s := range all {
		if s.user == name {
			return s, nil
		}
	}
	return xrdpSession{}, fmt.Errorf("user %q has no xrdp session on this host", name)
}

// Logoff ends name's session: its window manager gets SIGTERM, as at a
// shutdown, and xrdp-sesman then stops the X server and the channel
// server. Programs still running after the grace get SIGTERM, then
// SIGKILL; so do programs that left the session's process tree but kept
// its display (daemons a desktop starts).
func (x *XRDP) Logoff(ctx context.Context, name string) error {
	s, err := x.find(name)
	if err != nil {
		return err
	}
	tree := x.descendants(s.sesman)
	var wm []int
	for _, pid := range x.children(s.sesman) {
		if pid != s.xserver && x.comm(pid) != "xrdp-chansrv" {
			wm = append(wm, pid)
		}
	}
	if len(wm) == 0 {
		wm = []int{s.xserver} // no window manager left: the X server ends the session
	}
	signal(wm, syscall.SIGTERM)
	if x.waitGone(ctx, []int{s.xserver}, x.grace()) {
		x.sweep(ctx, s, tree)
		return nil
	}
	rest := append(x.descendants(s.sesman), s.xserver)
	signal(rest, syscall.SIGTERM)
	if !x.waitGone(ctx, rest, 5*time.Second) {
		signal(rest, syscall.SIGKILL)
		if !x.waitGone(ctx, rest, 5*time.Second) {
			return fmt.Errorf("the X server of %s's session (pid %d) survived SIGKILL", name, s.xserver)
		}
	}
	x.sweep(ctx, s, tree)
	return nil
}

// sweep stops the user's programs that outlived the session: those of
// its process tree, and any other with the session's display.
func (x *XRDP) sweep(ctx context.Context, s xrdpSession, tree []int) {
	var left []int
	for _, pid := range tree {
		if x.alive(pid) && x.uidOf(pid) == s.uid {
			left = append(left, pid)
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
				left = append(left, pid)
				break
			}
		}
	}
	if len(left) == 0 {
		return
	}
	signal(left, syscall.SIGTERM)
	if !x.waitGone(ctx, left, 3*time.Second) {
		signal(left, syscall.SIGKILL)
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

// waitGone waits up to d for every pid to end.
func (x *XRDP) waitGone(ctx context.Context, pids []int, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; {
		left := false
		for _, p := range pids {
			if x.alive(p) {
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

func signal(pids []int, sig syscall.Signal) {
	for _, p := range pids {
		_ = syscall.Kill(p, sig)
	}
}
