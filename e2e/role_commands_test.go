package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// wholeConfig has the roles of the package's file: gateway, broker and
// portal.
const wholeConfig = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: [admin-tok]}
auth:
  token_key: roles-test-key-0123456789abcdef0123456789
  users:
  - {name: alice, password: "Alice-Pass1", groups: [staff]}
gateway:
  listen: "127.0.0.1:%[3]d"
  public_name: "localhost:%[3]d"
  connection_policies: [{name: staff, groups: [staff]}]
  resource_policies: [{name: hosts, groups: [staff], hosts: [127.0.0.1]}]
broker:
  listen: "127.0.0.1:%[4]d"
  frontend_tokens: [portal-tok]
  delivery_groups:
  - {name: desk, groups: [staff]}
web:
  listen: "127.0.0.1:%[5]d"
`

// writeWholeConfig writes wholeConfig, its state in a folder of t's, on
// ports the kernel chose, and returns its path and the admin, gateway,
// broker and portal ports.
func writeWholeConfig(t *testing.T) (cfg string, adminPort, gwPort, brokerPort, webPort int) {
	t.Helper()
	dir := t.TempDir()
	adminPort, gwPort, brokerPort, webPort = testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
	cfg = filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(wholeConfig, filepath.Join(dir, "state"), adminPort, gwPort, brokerPort, webPort)), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg, adminPort, gwPort, brokerPort, webPort
}

// TestRoleCommandsWithTheWholeConfig: deskway-gateway.service and
// deskway-broker.service run deskway gateway and deskway broker on the
// package's /etc/deskway/deskway.yaml, which has every role. deskway
// gateway runs the gateway alone (its start line says so, the broker's
// and the portal's ports stay closed), and systemctl reload (SIGHUP)
// reloads either process rather than refusing the file for the sections
// of roles it does not run; deskway run still refuses a broker section
// added after it started.
func TestRoleCommandsWithTheWholeConfig(t *testing.T) {
	bin := build(t)
	cfg, adminPort, gwPort, brokerPort, webPort := writeWholeConfig(t)
	waitLog := func(p *testkit.Process, what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(p.Log.String(), what); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log:\n%s", what, p.Log.String())
			}
		}
	}
	reloads := func(p *testkit.Process, role string) {
		t.Helper()
		if err := syscall.Kill(p.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			log := p.Log.String()
			if strings.Contains(log, "configuration reload refused") {
				t.Fatalf("deskway %s refused the reload of a file with other roles' sections:\n%s", role, log)
			}
			if strings.Contains(log, "configuration reloaded") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("deskway %s: no reload in the log:\n%s", role, log)
			}
		}
	}

	gw := testkit.Start(t, nil, bin, "gateway", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", adminPort), 15*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, gw.Log.String())
	}
	waitLog(gw, "gateway listening")
	if !strings.Contains(gw.Log.String(), `"roles":["gateway"]`) {
		t.Errorf("deskway gateway ran more than the gateway:\n%s", gw.Log.String())
	}
	for _, port := range []int{brokerPort, webPort} {
		if testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 100*time.Millisecond) == nil {
			t.Errorf("deskway gateway listens on 127.0.0.1:%d, another role's port", port)
		}
	}
	reloads(gw, "gateway")
	stopProcess(t, gw)

	br := testkit.Start(t, nil, bin, "broker", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", brokerPort), 15*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, br.Log.String())
	}
	reloads(br, "broker")
	stopProcess(t, br)

	// deskway run on the file without its broker section: one added
	// later takes a restart, and the reload says so.
	whole, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	noBroker := regexp.MustCompile(`(?s)broker:.*?\nweb:\n  listen: "[^"]*"\n`).ReplaceAllString(string(whole), "")
	if err := os.WriteFile(cfg, []byte(noBroker), 0o600); err != nil {
		t.Fatal(err)
	}
	run := testkit.Start(t, nil, bin, "run", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", gwPort), 15*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, run.Log.String())
	}
	if err := os.WriteFile(cfg, whole, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(run.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog(run, "configuration reload refused")
	if !strings.Contains(run.Log.String(), "the file adds a gateway or broker section") {
		t.Errorf("the refusal of an added broker section does not say why:\n%s", run.Log.String())
	}
}

// TestReloadAskedWhileStarting: a SIGHUP that arrives while deskway is
// still opening its roles (a unit's ExecReload, or systemctl reload as
// soon as a port answers) is applied once every role serves, instead of
// ending the process, SIGHUP's default. It is sent as soon as the start
// line is logged, before the broker has opened its database and
// listened.
func TestReloadAskedWhileStarting(t *testing.T) {
	parallel(t)
	bin := build(t)
	cfg, adminPort, _, _, _ := writeWholeConfig(t)
	for _, role := range []string{"broker", "gateway", "run"} {
		p := testkit.Start(t, nil, bin, role, "-c", cfg)
		for deadline := time.Now().Add(15 * time.Second); !strings.Contains(p.Log.String(), `"msg":"deskway starting"`); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("deskway %s logged no start line:\n%s", role, p.Log.String())
			}
		}
		if err := syscall.Kill(p.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(15 * time.Second); !strings.Contains(p.Log.String(), "configuration reloaded"); time.Sleep(50 * time.Millisecond) {
			if err := syscall.Kill(p.Cmd.Process.Pid, 0); err != nil || time.Now().After(deadline) {
				t.Fatalf("deskway %s did not reload after a SIGHUP at its start (alive: %v):\n%s", role, err == nil, p.Log.String())
			}
		}
		if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", adminPort), 10*time.Second); err != nil {
			t.Fatalf("deskway %s: %v\n%s", role, err, p.Log.String())
		}
		stopProcess(t, p)
	}
}
