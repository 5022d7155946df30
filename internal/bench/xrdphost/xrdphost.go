// Package xrdphost readies this machine for a bench that starts xrdp:
// the checks before it starts (root, the tools, no session manager
// already on xrdp-sesman's port) and the host accounts its sessions log
// on to, each running a session script of the bench's, with the random
// passwords and tokens its rig sets; and xrdp itself, on a port of the
// bench's.
package xrdphost

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/loopback"
)

// Check says why bench cannot start xrdp here: it is not root (xrdp's
// session manager logs users on through PAM, and the bench adds users,
// named by users), a tool is missing, or a session manager already
// listens on 3350, whose sessions the bench would reach instead.
func Check(bench, users string, tools ...string) error {
	if os.Geteuid() != 0 {
		return errors.New(bench + ": run as root: it starts xrdp, whose session manager logs users in through PAM, and adds " + users)
	}
	for _, p := range tools {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s: %s is missing (make deps installs it)", bench, p)
		}
	}
	for _, a := range []string{"127.0.0.1:3350", "[::1]:3350"} {
		if c, err := net.DialTimeout("tcp", a, 200*time.Millisecond); err == nil {
			c.Close()
			return fmt.Errorf("%s: a session manager already listens on %s; stop it first", bench, a)
		}
	}
	return nil
}

// Account makes the host account name (or takes the one an earlier run
// made) with password, ends what it still runs (a session left from an
// earlier run would be reconnected to), and writes startwm as its
// ~/startwm.sh, the script xrdp's session runs.
func Account(name, password, startwm string) error {
	if _, err := user.Lookup(name); err != nil {
		if out, err := exec.Command("useradd", "-m", "-s", "/bin/bash", name).CombinedOutput(); err != nil {
			return fmt.Errorf("useradd %s: %w: %s", name, err, out)
		}
	}
	cp := exec.Command("chpasswd")
	cp.Stdin = strings.NewReader(name + ":" + password + "\n")
	if out, err := cp.CombinedOutput(); err != nil {
		return fmt.Errorf("chpasswd %s: %w: %s", name, err, out)
	}
	_ = exec.Command("pkill", "-KILL", "-u", name).Run()
	wm := filepath.Join("/home", name, "startwm.sh")
	if err := os.WriteFile(wm, []byte(startwm), 0o755); err != nil {
		return err
	}
	if out, err := exec.Command("chown", name+":", wm).CombinedOutput(); err != nil {
		return fmt.Errorf("chown %s: %w: %s", wm, err, out)
	}
	return nil
}

// Secret is n random hex digits: a password or token a bench's rig sets
// for one run.
func Secret(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// StartXRDP starts xrdp's session manager and xrdp from the system's
// configuration, xrdp on 127.0.0.1:port (its xrdp.ini written into dir,
// where it keeps its log, xrdp.log), and waits up to 10 s for xrdp to
// listen. sesmanArgs are added to the session manager's command line (a
// configuration of the bench's). The two are returned in the order they
// started, to be stopped in reverse; on an error, those started are
// stopped.
func StartXRDP(dir string, port int, sesmanArgs ...string) ([]*childproc.Proc, error) {
	ini, err := os.ReadFile("/etc/xrdp/xrdp.ini")
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cfg := regexp.MustCompile(`(?m)^port=3389\s*$`).ReplaceAllString(string(ini), "port=tcp://"+addr)
	// Its log goes into dir, each line with the process that wrote it
	// (xrdp forks one per connection): the system's log is shared with
	// every other xrdp on the machine, and a bench's failure is told
	// from its own connections' lines.
	cfg = regexp.MustCompile(`(?m)^LogFile=.*$`).ReplaceAllString(cfg, "LogFile="+filepath.Join(dir, "xrdp.log"))
	cfg = regexp.MustCompile(`(?m)^#?EnableProcessId=.*$`).ReplaceAllString(cfg, "EnableProcessId=true")
	iniPath := filepath.Join(dir, "xrdp.ini")
	if err := os.WriteFile(iniPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	// Left by an xrdp killed earlier, a pid file stops the next from
	// starting.
	if err := childproc.PrepareXRDPSocketDir("/var/run/xrdp/sockdir"); err != nil {
		return nil, err
	}
	_ = os.Remove("/var/run/xrdp/xrdp-sesman.pid")
	_ = os.Remove("/var/run/xrdp/xrdp.pid")
	var procs []*childproc.Proc
	stop := func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].Stop()
		}
	}
	for _, c := range [][]string{append([]string{"xrdp-sesman", "--nodaemon"}, sesmanArgs...), {"xrdp", "--nodaemon", "--config", iniPath}} {
		p, err := childproc.Start(nil, c[0], c[1:]...)
		if err != nil {
			stop()
			return nil, err
		}
		procs = append(procs, p)
	}
	if err := loopback.WaitPort(addr, 10*time.Second); err != nil {
		stop()
		return nil, fmt.Errorf("xrdp: %w", err)
	}
	return procs, nil
}
