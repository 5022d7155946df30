package e2e

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// unit is what a systemd unit file says of how its service runs.
type unit struct {
	name, user, group, execStart string
	envFiles                     []string // EnvironmentFile=, "-" prefix kept
	ambient, bounding            []string // capabilities, lower case without cap_
	umask                        string
	protectSystem, protectHome   string
	privateTmp                   bool
}

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{name: filepath.Base(path), user: "root", umask: "0022"}
	caps := func(v string) []string {
		var c []string
		for _, x := range strings.Fields(v) {
			c = append(c, strings.TrimPrefix(strings.ToLower(x), "cap_"))
		}
		return c
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		switch k {
		case "User":
			u.user = v
		case "Group":
			u.group = v
		case "ExecStart":
			u.execStart = v
		case "EnvironmentFile":
			u.envFiles = append(u.envFiles, v)
		case "AmbientCapabilities":
			u.ambient = caps(v)
		case "CapabilityBoundingSet":
			u.bounding = caps(v)
		case "UMask":
			u.umask = v
		case "ProtectSystem":
			u.protectSystem = v
		case "ProtectHome":
			u.protectHome = v
		case "PrivateTmp":
			u.privateTmp = v == "yes"
		}
	}
	return u
}

// unitEnv is the environment systemd gives u's process: its fixed
// variables and those of its EnvironmentFile= lines (a missing file is
// an error unless the name has the "-" prefix).
func unitEnv(t *testing.T, u unit) []string {
	t.Helper()
	home := "/root"
	if u.user != "root" {
		out, err := exec.Command("getent", "passwd", u.user).Output()
		if err != nil {
			t.Fatalf("%s: no user %s: %v", u.name, u.user, err)
		}
		home = strings.Split(strings.TrimSpace(string(out)), ":")[5]
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "HOME=" + home, "USER=" + u.user, "LOGNAME=" + u.user, "LANG=C.UTF-8"}
	for _, ef := range u.envFiles {
		path, optional := strings.CutPrefix(ef, "-")
		b, err := os.ReadFile(path)
		if err != nil {
			if optional && os.IsNotExist(err) {
				continue
			}
			t.Fatalf("%s: EnvironmentFile=%s: %v", u.name, ef, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
				continue
			}
			if k, v, ok := strings.Cut(line, "="); ok {
				env = append(env, k+"="+strings.Trim(v, `"'`))
			}
		}
	}
	return env
}

// unitCommand is u's ExecStart as systemd runs it without being PID 1
// here: as its user and group (with the user's groups), with its bounding
// and ambient capabilities, no new privileges, its umask and environment,
// in its state directory /var/lib/deskway (StateDirectory=, 0750, owned
// by the unit's user and group), and in a mount namespace where, as
// ProtectSystem=strict, ProtectHome= and PrivateTmp= say, the system is
// read-only but for the state directory, /home and /root are empty or
// read-only, and /tmp and /var/tmp are its own. The other sandbox options
// (system call filter, namespaces, devices) are not reproduced.
func unitCommand(t *testing.T, u unit) *exec.Cmd {
	t.Helper()
	if err := os.MkdirAll("/var/lib/deskway", 0o750); err != nil {
		t.Fatal(err)
	}
	// systemd hands the state directory to the unit's user and group (the
	// user's own group when Group= is not set), root's too.
	if out, err := exec.Command("chown", "-R", u.user+":"+u.group, "/var/lib/deskway").CombinedOutput(); err != nil {
		t.Fatalf("chown: %v %s", err, out)
	}
	os.Chmod("/var/lib/deskway", 0o750)
	sandbox := []string{"mount --bind /var/lib/deskway /var/lib/deskway"}
	if u.privateTmp {
		sandbox = append(sandbox, "mount -t tmpfs -o mode=1777 tmpfs /tmp", "mount -t tmpfs -o mode=1777 tmpfs /var/tmp")
	}
	switch u.protectHome {
	case "yes":
		sandbox = append(sandbox, "mount -t tmpfs -o ro,mode=0755 tmpfs /home", "mount -t tmpfs -o ro,mode=0700 tmpfs /root")
	case "read-only":
		sandbox = append(sandbox, "mount --bind /home /home", "mount -o remount,bind,ro /home", "mount --bind /root /root", "mount -o remount,bind,ro /root")
	}
	if u.protectSystem == "strict" {
		sandbox = append(sandbox, "mount -o remount,bind,ro /")
	} else if u.protectSystem != "" {
		t.Fatalf("%s: ProtectSystem=%s is not reproduced here", u.name, u.protectSystem)
	}
	args := []string{"--mount", "--propagation", "private", "sh", "-ec", strings.Join(sandbox, " && ") + ` && exec "$@"`, "sh",
		"setpriv", "--reuid", u.user, "--init-groups"}
	if u.group != "" {
		args = append(args, "--regid", u.group)
	}
	bounding := "-all"
	if len(u.bounding) > 0 {
		bounding += ",+" + strings.Join(u.bounding, ",+")
	}
	args = append(args, "--bounding-set", bounding)
	if len(u.ambient) > 0 {
		c := "+" + strings.Join(u.ambient, ",+")
		args = append(args, "--inh-caps", c, "--ambient-caps", c)
	}
	args = append(args, "--no-new-privs", "--", "sh", "-c", `umask "$0" && exec "$@"`, u.umask)
	args = append(args, strings.Fields(u.execStart)...)
	cmd := exec.Command("unshare", args...)
	cmd.Env = unitEnv(t, u)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// startUnit starts u's process and returns it with its output; it is
// killed at the end of the test if still running.
func startUnit(t *testing.T, u unit) (*exec.Cmd, *testkit.Buffer) {
	t.Helper()
	cmd := unitCommand(t, u)
	log := &testkit.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", u.name, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	})
	return cmd, log
}

// stopUnit stops cmd as systemctl stop does (SIGTERM) and fails unless
// it exits cleanly within the unit's TimeoutStopSec (45s).
func stopUnit(t *testing.T, name string, cmd *exec.Cmd, log *testkit.Buffer) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s stopped with %v\n%s", name, err, lastLines(log.String(), 20))
		}
	case <-time.After(45 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Errorf("%s did not stop within 45s of SIGTERM\n%s", name, lastLines(log.String(), 20))
	}
}

// runUnitToExit runs u's process, which is to stop by itself, and returns
// its exit error and output.
func runUnitToExit(t *testing.T, u unit) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := unitCommand(t, u)
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	c.Env, c.Dir, c.SysProcAttr = cmd.Env, cmd.Dir, cmd.SysProcAttr
	out, err := c.CombinedOutput()
	return string(out), err
}

// fakeSystemd runs shell lines (dpkg with the package's maintainer
// scripts) where they see a running systemd: in a mount namespace of
// their own with /run/systemd/system present, and a systemctl first on
// PATH that records each call and answers is-active and is-enabled from
// the given unit lists. It returns the systemctl calls, one a line.
func fakeSystemd(t *testing.T, active, enabled []string, env []string, script string) (calls []string, out string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	os.MkdirAll(bin, 0o755)
	os.WriteFile(filepath.Join(dir, "active"), []byte(strings.Join(active, "\n")+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "enabled"), []byte(strings.Join(enabled, "\n")+"\n"), 0o644)
	fake := `#!/bin/sh
printf '%s\n' "$*" >> ` + dir + `/calls
case "$*" in
"--quiet is-active "*) exec grep -qx "$3" ` + dir + `/active ;;
"--quiet is-enabled "*) exec grep -qx "$3" ` + dir + `/enabled ;;
esac
`
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	c := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-ec",
		`mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && export PATH="$0:$PATH" && `+script, bin)
	c.Env = append(os.Environ(), env...)
	b, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, b)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "calls"))
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if l != "" {
			calls = append(calls, l)
		}
	}
	return calls, string(b)
}
