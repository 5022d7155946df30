package e2e

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// unit is what a systemd unit file says of how its service runs.
type unit struct {
	user, group, execStart string
	caps                   []string // AmbientCapabilities, lower case without cap_
}

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var u unit
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
		case "AmbientCapabilities":
			for _, c := range strings.Fields(v) {
				u.caps = append(u.caps, strings.TrimPrefix(strings.ToLower(c), "cap_"))
			}
		}
	}
	return u
}

// TestDebianPackage: the package make deb builds installs on this
// machine by the README's own lines (make deb, apt-get install), makes
// its system user, ships units that systemd-analyze verify accepts, runs a role as its unit does (the unit's user, group,
// capabilities and command line, in the state directory systemd would
// make), and purges cleanly: binaries, units, config, user and state
// gone, the state kept when DESKWAY_KEEP_DATA=1 is asked for.
func TestDebianPackage(t *testing.T) {
	testkit.RequireRoot(t)
	testkit.Require(t, "dpkg", "systemd-analyze", "setpriv", "adduser")
	if exec.Command("dpkg-query", "-W", "deskway").Run() == nil {
		t.Fatal("a deskway package is already installed on this machine; this test installs and purges its own: dpkg -P deskway first")
	}
	// The README's lines, as written, from the top directory.
	block := readmeBlocks(t)["install-deb"]
	if block == "" {
		t.Fatal("README.md has no block marked <!-- e2e: install-deb -->")
	}
	t.Cleanup(func() { _ = exec.Command("dpkg", "-P", "deskway").Run() })
	inst := exec.Command("bash", "-ec", block)
	inst.Dir = ".."
	inst.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := inst.CombinedOutput(); err != nil {
		t.Fatalf("the README's install-deb lines: %v\n%s", err, lastLines(string(out), 30))
	}
	debs, _ := filepath.Glob("../bin/deskway_*_amd64.deb")
	if len(debs) != 1 {
		t.Fatalf("make deb left %d packages in bin/: %v", len(debs), debs)
	}
	deb := debs[0]
	dpkg := func(env []string, args ...string) string {
		t.Helper()
		c := exec.Command("dpkg", args...)
		c.Env = append(os.Environ(), env...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	for _, f := range []string{"/usr/bin/deskway", "/usr/bin/deskway-nbdroot", "/etc/deskway/deskway.yaml", "/usr/share/doc/deskway/README.md",
		"/lib/systemd/system/deskway.service", "/lib/systemd/system/deskway-gateway.service", "/lib/systemd/system/deskway-broker.service",
		"/lib/systemd/system/deskway-agent.service", "/lib/systemd/system/deskway-stream.service"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the package did not install %s: %v", f, err)
		}
	}
	if out, err := exec.Command("getent", "passwd", "deskway").Output(); err != nil || !strings.Contains(string(out), ":/var/lib/deskway:") {
		t.Fatalf("no system user deskway with home /var/lib/deskway: %v %q", err, out)
	}
	if out, _ := exec.Command("stat", "-c", "%a %U:%G", "/etc/deskway/deskway.yaml").Output(); strings.TrimSpace(string(out)) != "640 root:deskway" {
		t.Errorf("the config is %s, want 640 root:deskway (its users' secrets are for the service alone)", out)
	}
	units, _ := filepath.Glob("/lib/systemd/system/deskway*.service")
	if out, err := exec.Command("systemd-analyze", append([]string{"verify"}, units...)...).CombinedOutput(); err != nil || strings.Contains(string(out), "deskway") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}

	// The gateway as deskway-gateway.service runs it: its user, group and
	// capabilities, in the state directory systemd makes (0750, its user's).
	u := readUnit(t, "/lib/systemd/system/deskway-gateway.service")
	if u.user != "deskway" || u.group != "deskway" || strings.Join(u.caps, ",") != "net_bind_service" {
		t.Fatalf("deskway-gateway.service: %+v", u)
	}
	port := testkit.FreePort(t)
	// The token key where an operator keeps it: beside the config,
	// readable by the service's group only.
	key := "/etc/deskway/token.key"
	os.WriteFile(key, []byte(strings.Repeat("k", 32)), 0o640)
	exec.Command("chgrp", "deskway", key).Run()
	os.WriteFile("/etc/deskway/deskway.yaml", []byte(fmt.Sprintf(`state_dir: /var/lib/deskway
log: {level: info, format: text}
auth: {token_key: "file:%s"}
gateway:
  listen: "127.0.0.1:%d"
  auth_methods: [paa]
  resource_policies: [{name: hosts, users: ["*"], hosts: [127.0.0.1]}]
  connection_policies: [{name: all, users: ["*"]}]
`, key, port)), 0o640)
	os.MkdirAll("/var/lib/deskway", 0o750)
	exec.Command("chown", "deskway:deskway", "/var/lib/deskway").Run()
	args := strings.Fields(u.execStart)
	caps := "+" + strings.Join(u.caps, ",+")
	gw := testkit.Start(t, nil, "setpriv", append([]string{"--reuid", u.user, "--regid", u.group, "--init-groups",
		"--inh-caps", caps, "--ambient-caps", caps, "--bounding-set", "-all," + caps, "--no-new-privs", "--"}, args...)...)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 15*time.Second); err != nil {
		t.Fatalf("the gateway did not listen: %v\n%s", err, gw.Log.String())
	}
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatalf("TLS to the packaged gateway: %v\n%s", err, gw.Log.String())
	}
	c.Close()
	if out, err := exec.Command("ps", "-o", "user=", "-p", fmt.Sprint(gw.Cmd.Process.Pid)).Output(); err != nil || strings.TrimSpace(string(out)) != "deskway" {
		t.Fatalf("the gateway runs as %q (%v), not deskway", out, err)
	}
	// It made its self-signed certificate in the state directory, as its
	// own user.
	if out, err := exec.Command("stat", "-c", "%U %a", "/var/lib/deskway/tls.key").Output(); err != nil || !strings.HasPrefix(string(out), "deskway ") {
		t.Errorf("/var/lib/deskway/tls.key: %q %v", out, err)
	}
	_ = gw.Cmd.Process.Kill()
	_ = gw.Cmd.Wait()

	// Purged with the data kept, then purged for good.
	dpkg([]string{"DESKWAY_KEEP_DATA=1"}, "-P", "deskway")
	if _, err := os.Stat("/var/lib/deskway"); err != nil {
		t.Fatalf("DESKWAY_KEEP_DATA=1 dpkg -P removed the state: %v", err)
	}
	dpkg(nil, "-i", deb)
	dpkg(nil, "-P", "deskway")
	for _, f := range []string{"/usr/bin/deskway", "/etc/deskway", "/lib/systemd/system/deskway.service", "/var/lib/deskway"} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("dpkg -P left %s behind", f)
		}
	}
	if exec.Command("getent", "passwd", "deskway").Run() == nil || exec.Command("getent", "group", "deskway").Run() == nil {
		t.Error("dpkg -P left the deskway user or group behind")
	}
}
