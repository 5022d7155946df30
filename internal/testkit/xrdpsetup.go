package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/childproc"
)

// XRDPSetup is one xrdp setup of the machine: what its session manager
// listens on, the X displays it gives sessions and the account they log
// on as, none of them shared with another setup, so that a test on each
// can run at the same time. A test holds its lock while it runs xrdp
// there (NewXRDPNamespace takes it).
type XRDPSetup struct {
	// Lock is the machine-wide lock of the setup.
	Lock string
	// SesmanPort is xrdp-sesman's port. xrdp reads it from
	// /etc/xrdp/sesman.ini, a path compiled into it (Debian 12's
	// 0.9.21: xrdp_mm_get_sesman_port; no option names another file),
	// so a setup on another port runs on a copy of /etc/xrdp.
	SesmanPort int
	// Displays are the first and last X display sesman gives sessions
	// (X11DisplayOffset, and MaxSessions after it).
	Displays [2]int
	// User is the account the setup's sessions log on as.
	User string
	// private: the setup runs on copies of /etc/xrdp and /run/xrdp of its
	// own, bound over those paths in its namespace.
	private bool
}

// MachineXRDP is the setup of the machine's own configuration:
// /etc/xrdp and /run/xrdp as they are, sesman on port 3350, displays 10
// to 60 (X11DisplayOffset 10 and MaxSessions 50 in Debian's sesman.ini).
// README's make run and the benches start xrdp the same way, and so hold
// its lock, LockSesman.
func MachineXRDP() XRDPSetup {
	return XRDPSetup{Lock: LockSesman, SesmanPort: 3350, Displays: [2]int{10, 60}, User: "dwtest"}
}

// SecondXRDP is a setup beside MachineXRDP's: sesman on port 3351,
// displays 200 to 250 (beyond the Xvfb displays testkit and the benches
// take, 90 to 199), the account dwtest2, and its own copies of /etc/xrdp
// and /run/xrdp (its pid files and the sockets sesman's sessions and
// xrdp meet on).
func SecondXRDP() XRDPSetup {
	return XRDPSetup{Lock: LockSesmanSecond, SesmanPort: 3351, Displays: [2]int{200, 250}, User: "dwtest2", private: true}
}

// XRDPNamespace is a mount and PID namespace for one setup's xrdp, its
// sessions, and the deskway agent that reads them. The agent takes every
// X server that an xrdp-sesman started as a session of its host, reading
// /proc; in the namespace /proc shows its own processes only, so an
// agent there does not report the sessions of a test on another setup,
// nor an agent outside see this one's through the sessions it reports (a
// test whose agent runs outside, such as make run's, holds every setup's
// lock). When it ends, every process in it ends.
type XRDPNamespace struct {
	Setup XRDPSetup
	// enter runs a command inside: nsenter with the namespaces' files.
	enter []string
}

// NewXRDPNamespace takes setup's lock for the rest of t and makes its
// namespace, which ends with t.
func NewXRDPNamespace(t testing.TB, setup XRDPSetup) *XRDPNamespace {
	t.Helper()
	RequireRoot(t)
	Require(t, "unshare", "nsenter", "mount", "cp")
	Lock(t, setup.Lock)
	// X servers killed with the namespace leave their socket and lock
	// file behind, which sesman takes as a display in use. Registered
	// before the namespace, this runs after it has ended.
	t.Cleanup(func() { childproc.RemoveUnansweringX(setup.Displays[0], setup.Displays[1]) })
	childproc.RemoveUnansweringX(setup.Displays[0], setup.Displays[1])
	// The first process is the namespace's init: it ends on SIGTERM (an
	// init gets only the signals it handles), and all in it end with it.
	script := "trap 'exit 0' TERM; echo ready; while :; do sleep 3600 & wait $!; done"
	if setup.private {
		etc, run := privateXRDPDirs(t, setup)
		script = fmt.Sprintf("set -e; mount --bind %s /etc/xrdp; mount --bind %s /run/xrdp; %s", etc, run, script)
	}
	first := Start(t, nil, "unshare", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", script)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(first.Log.String(), "ready\n"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the namespace of xrdp's setup on port %d did not start: %s", setup.SesmanPort, first.Log.String())
		}
	}
	// unshare made the mount namespace for itself and the PID namespace
	// for the children it forks.
	pid := first.Cmd.Process.Pid
	return &XRDPNamespace{Setup: setup, enter: []string{"nsenter",
		fmt.Sprintf("--mount=/proc/%d/ns/mnt", pid), fmt.Sprintf("--pid=/proc/%d/ns/pid_for_children", pid), "--"}}
}

// Command is the command line that runs name with args inside the
// namespace.
func (n *XRDPNamespace) Command(name string, args ...string) []string {
	return append(append(append([]string(nil), n.enter...), name), args...)
}

// Start is Start inside the namespace.
func (n *XRDPNamespace) Start(t testing.TB, env []string, name string, args ...string) *Process {
	t.Helper()
	c := n.Command(name, args...)
	return Start(t, env, c[0], c[1:]...)
}

// privateXRDPDirs writes setup's copies of /etc/xrdp (sesman.ini with
// its port, displays and a log file of its own) and of /run/xrdp, and
// returns their paths.
func privateXRDPDirs(t testing.TB, setup XRDPSetup) (etc, run string) {
	t.Helper()
	dir := t.TempDir()
	etc, run = filepath.Join(dir, "etc"), filepath.Join(dir, "run")
	if out, err := exec.Command("cp", "-a", "/etc/xrdp", etc).CombinedOutput(); err != nil {
		t.Fatalf("copy /etc/xrdp: %v %s", err, out)
	}
	ini, err := os.ReadFile(filepath.Join(etc, "sesman.ini"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(ini)
	for key, value := range map[string]string{
		"ListenPort":       strconv.Itoa(setup.SesmanPort),
		"X11DisplayOffset": strconv.Itoa(setup.Displays[0]),
		"MaxSessions":      strconv.Itoa(setup.Displays[1] - setup.Displays[0]),
		"LogFile":          filepath.Join(dir, "xrdp-sesman.log"),
	} {
		re := regexp.MustCompile(`(?m)^` + key + `=.*$`)
		if !re.MatchString(s) {
			t.Fatalf("/etc/xrdp/sesman.ini has no %s line", key)
		}
		s = re.ReplaceAllLiteralString(s, key+"="+value)
	}
	if err := os.WriteFile(filepath.Join(etc, "sesman.ini"), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	sockdir := filepath.Join(run, "sockdir")
	if err := os.MkdirAll(sockdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sockdir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "xrdp-sesman.log"))
			t.Logf("--- xrdp-sesman.log of the setup on port %d:\n%s", setup.SesmanPort, tail(string(b), 4000))
		}
	})
	return etc, run
}
