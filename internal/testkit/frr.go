package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// frrBgpd is where Debian's frr package puts the BGP daemon.
const frrBgpd = "/usr/lib/frr/bgpd"

// FRR is a bgpd from Debian's frr package running in a network namespace
// the test made, with its configuration, pid file and vty socket in a
// directory of the test's own: the machine's /etc/frr and /run/frr are
// neither read nor written.
type FRR struct {
	Netns string   // the namespace bgpd runs in
	Dir   string   // its bgpd.conf, pid file and vty socket
	Proc  *Process // bgpd, with its log
}

// StartFRR runs bgpd in netns with conf as its bgpd.conf, without zebra
// (-Z: no kernel routes) and without a vty TCP port; it is stopped at test
// end. It returns once vtysh can talk to it.
func StartFRR(t testing.TB, netns, conf string) *FRR {
	t.Helper()
	Require(t, "vtysh", "ip")
	if _, err := os.Stat(frrBgpd); err != nil {
		missingThing(t, "frr ("+frrBgpd+")")
	}
	f := &FRR{Netns: netns, Dir: t.TempDir()}
	confFile := filepath.Join(f.Dir, "bgpd.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	// vtysh reads its own settings from the same directory (--config_dir).
	if err := os.WriteFile(filepath.Join(f.Dir, "vtysh.conf"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// -S: run as root without switching to the frr user, which could not
	// write the test's directory.
	f.Proc = Start(t, nil, "ip", "netns", "exec", netns, frrBgpd,
		"-f", confFile, "-i", filepath.Join(f.Dir, "bgpd.pid"), "--vty_socket", f.Dir,
		"-Z", "-S", "-P", "0", "--log", "stdout")
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := f.vtysh("show bgp summary")
		if err == nil {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("frr: vtysh never answered: %v\n%s\n--- bgpd:\n%s", err, out, tail(f.Proc.Log.String(), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Vtysh runs vtysh with one -c per command in the router's namespace and
// returns its output.
func (f *FRR) Vtysh(t testing.TB, commands ...string) string {
	t.Helper()
	out, err := f.vtysh(commands...)
	if err != nil {
		t.Fatalf("vtysh %q: %v\n%s", commands, err, out)
	}
	return out
}

func (f *FRR) vtysh(commands ...string) (string, error) {
	args := []string{"netns", "exec", f.Netns, "vtysh", "--vty_socket", f.Dir, "--config_dir", f.Dir}
	for _, c := range commands {
		args = append(args, "-c", c)
	}
	// stdout only: the answer may be JSON; complaints go to the error.
	var stderr strings.Builder
	cmd := exec.Command("ip", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil && stderr.Len() > 0 {
		err = fmt.Errorf("vtysh complained: %s", strings.TrimSpace(stderr.String()))
	} else if err != nil {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return string(out), err
}

// Kill ends bgpd with SIGKILL: no NOTIFICATION is sent.
func (f *FRR) Kill() {
	_ = syscall.Kill(-f.Proc.Cmd.Process.Pid, syscall.SIGKILL)
}
