package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/config"
)

// demoAccount is the session host account deskway up makes for the demo
// portal user: a Unix user of this machine that xrdp logs on.
const demoAccount = "deskway-demo"

// hostPackages are what this machine needs to be the demo's session
// host: xrdp with its X server, a window manager and a terminal. twm is
// the window manager: it is the smallest Debian has that places,
// decorates, moves and resizes windows and has a menu to start another
// terminal (264 kB, with nothing but the X libraries xrdp already pulls
// in); openbox pulls in ghostscript through imlib2 (about 30 MB), icewm
// more again.
var hostPackages = []string{"xrdp", "xorgxrdp", "twm", "xterm"}

// demoStartWM is the demo account's xrdp session (xrdp-sesman runs
// ~/startwm.sh when it exists): a terminal, and twm managing it.
const demoStartWM = `#!/bin/sh
# Written by "deskway up": this desktop's session, twm with an xterm.
# Right-click the background for another terminal or to log off.
# The terminal in a UTF-8 locale: in xrdp's default (C) it drops € and
# its shell reads é as a Latin-1 byte. twm stays in C: in a UTF-8
# locale it wants fonts the machine may not have, and exits. The
# terminal's font is fontconfig's monospace (xterm's dependencies bring
# one): the X server's built-in "fixed" has no €.
LANG=C.UTF-8 xterm -fa Monospace -fs 11 -geometry 90x28+40+40 -bg navy -fg white &
exec twm
`

// demoTWMRC places new windows without asking, and gives the
// background a menu.
const demoTWMRC = `# Written by "deskway up".
RandomPlacement
NoGrabServer
DecorateTransients
Color {
  TitleBackground "steelblue"
  TitleForeground "white"
  MenuTitleBackground "steelblue"
  MenuTitleForeground "white"
}
Button3 = : root : f.menu "desktop"
menu "desktop" {
  "Desktop"  f.title
  "Terminal" f.exec "LANG=C.UTF-8 xterm -fa Monospace -fs 11 -bg navy -fg white &"
  "Log off"  f.quit
}
`

// sessionHost makes this machine the demo's session host, saying on out
// each thing it does to the machine: it makes the demo desktop account
// with the config's password, gives it a window manager and a terminal,
// and starts xrdp on loopback unless one already listens there
// (installHostPackages has installed them). What it started stops with
// ctx; wait returns once it has.
func sessionHost(ctx context.Context, out io.Writer, cfg *config.Config) (wait func(), err error) {
	wait = func() {}
	if os.Geteuid() != 0 {
		fmt.Fprintf(out, "session host: not set up (it needs root): no xrdp, no %s account; run make run as root, or connect to an RDP host of your own\n", demoAccount)
		return wait, nil
	}
	var acct *config.DesktopAccount
	for i, d := range cfg.Auth.DesktopAccounts {
		if d.Account == demoAccount {
			acct = &cfg.Auth.DesktopAccounts[i]
		}
	}
	if acct == nil {
		fmt.Fprintf(out, "session host: %s maps no user to %s (it was written by an older deskway up): no desktop account made; delete it to have one written\n",
			filepath.Join(cfg.StateDir, "up.yaml"), demoAccount)
	} else if err := demoDesktop(ctx, out, acct.Password.Value()); err != nil {
		return wait, err
	}
	// The demo's xrdp listens on loopback only, where the gateway's
	// resource policy and the local agent reach it (--rdp-port).
	return startXRDP(ctx, out, cfg.StateDir, net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.Agent.Port)))
}

// installHostPackages installs the hostPackages that are missing, as
// scripts/install-deps.sh does, and keeps Debian's xrdp service (which
// listens on every interface) from running.
func installHostPackages(ctx context.Context, out io.Writer) error {
	if os.Geteuid() != 0 {
		return nil
	}
	var missing []string
	for _, p := range hostPackages {
		st, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Status}", p).Output()
		if err != nil || !strings.Contains(string(st), "install ok installed") {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	fmt.Fprintf(out, "session host: installing %s (apt-get install --no-install-recommends)\n", strings.Join(missing, " "))
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq", "--no-install-recommends"}, missing...)} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = env
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("session host: apt-get %s: %w\n%s", args[0], err, lastOutput(b))
		}
	}
	if slices.Contains(missing, "xrdp") {
		fmt.Fprintln(out, "session host: stopped and disabled Debian's xrdp service (it listens on every interface); deskway up starts xrdp on loopback itself")
		_ = exec.CommandContext(ctx, "systemctl", "disable", "--now", "xrdp", "xrdp-sesman").Run()
	}
	return nil
}

// demoDesktop makes the demo desktop account if it is missing, sets its
// password to the config's, and writes its session.
func demoDesktop(ctx context.Context, out io.Writer, password string) error {
	u, err := user.Lookup(demoAccount)
	if err != nil {
		var unknown user.UnknownUserError
		if !errors.As(err, &unknown) {
			return fmt.Errorf("session host: look up %s: %w", demoAccount, err)
		}
		if b, err := exec.CommandContext(ctx, "useradd", "-m", "-s", "/bin/bash", "-c", "deskway demo desktop", demoAccount).CombinedOutput(); err != nil {
			return fmt.Errorf("session host: useradd %s: %w\n%s", demoAccount, err, lastOutput(b))
		}
		fmt.Fprintf(out, "session host: created the Unix account %s (useradd -m), the demo's desktop\n", demoAccount)
		if u, err = user.Lookup(demoAccount); err != nil {
			return fmt.Errorf("session host: %w", err)
		}
	}
	cp := exec.CommandContext(ctx, "chpasswd")
	cp.Stdin = strings.NewReader(demoAccount + ":" + password + "\n")
	if b, err := cp.CombinedOutput(); err != nil {
		return fmt.Errorf("session host: chpasswd %s: %w\n%s", demoAccount, err, lastOutput(b))
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	for name, body := range map[string]string{"startwm.sh": demoStartWM, ".twmrc": demoTWMRC} {
		p := filepath.Join(u.HomeDir, name)
		if old, err := os.ReadFile(p); err == nil && string(old) == body {
			continue
		}
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			return fmt.Errorf("session host: %w", err)
		}
		if err := os.Chown(p, uid, gid); err != nil {
			return fmt.Errorf("session host: %w", err)
		}
	}
	fmt.Fprintf(out, "session host: %s's password is the one in the credentials file (chpasswd); its xrdp session is twm with an xterm (%s/startwm.sh)\n",
		demoAccount, u.HomeDir)
	return nil
}

// startXRDP starts xrdp-sesman and xrdp on xrdpAddr, unless an RDP
// server already listens there, and stops them when ctx ends.
func startXRDP(ctx context.Context, out io.Writer, stateDir, xrdpAddr string) (func(), error) {
	if listening(xrdpAddr) {
		fmt.Fprintf(out, "session host: an RDP server already listens on %s; deskway up uses it and leaves it alone\n", xrdpAddr)
		return func() {}, nil
	}
	ini, err := os.ReadFile("/etc/xrdp/xrdp.ini")
	if err != nil {
		return func() {}, fmt.Errorf("session host: %w", err)
	}
	loop := regexp.MustCompile(`(?m)^port=3389\s*$`).ReplaceAll(ini, []byte("port=tcp://"+xrdpAddr))
	path := filepath.Join(stateDir, "xrdp.ini")
	if err := os.WriteFile(path, loop, 0o644); err != nil {
		return func() {}, fmt.Errorf("session host: %w", err)
	}
	if err := childproc.PrepareXRDPSocketDir("/var/run/xrdp/sockdir"); err != nil {
		return func() {}, fmt.Errorf("session host: %w", err)
	}
	var procs []*exec.Cmd
	start := func(name string, args ...string) error {
		_ = os.Remove("/var/run/xrdp/" + name + ".pid")
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("session host: start %s: %w", name, err)
		}
		procs = append(procs, cmd)
		return nil
	}
	wait := func() {
		for _, p := range procs {
			_ = p.Wait()
		}
	}
	what := "xrdp"
	if !listening("127.0.0.1:3350") && !listening("[::1]:3350") {
		if err := start("xrdp-sesman", "--nodaemon"); err != nil {
			return wait, err
		}
		what = "xrdp and xrdp-sesman"
	}
	if err := start("xrdp", "--nodaemon", "--config", path); err != nil {
		return wait, err
	}
	for deadline := time.Now().Add(15 * time.Second); !listening(xrdpAddr); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return wait, fmt.Errorf("session host: xrdp did not listen on %s within 15s", xrdpAddr)
		}
	}
	fmt.Fprintf(out, "session host: started %s on %s (loopback only, until deskway up stops)\n", what, xrdpAddr)
	return wait, nil
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// lastOutput is the end of a command's output, for an error.
func lastOutput(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	return s
}
