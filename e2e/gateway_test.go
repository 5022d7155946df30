// Here, Debian's xfreerdp connects through deskway gateway to a real
// xrdp host.

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

type rig struct {
	bin, cfg, gw, display string
	xrdp                  *testkit.XRDP
	gwLog                 *testkit.Process
	artifacts             string
	consent               string // what xfreerdp reads on stdin when asked to consent
}

const gatewayConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: ["e2e-admin-token"]}
tls: {cert: %[3]s, key: %[4]s}
auth:
  token_key: "e2e-token-key-0123456789abcdef0123456789"
  users:
  - {name: gwuser, password: "Gw-Pass-123", groups: [staff]}
gateway:
  listen: "127.0.0.1:%[5]d"
  consent_message: "Authorized use only. Accept?"
  connection_policies:
  - {name: staff, groups: [staff]}
  resource_policies:
  - {name: rdp, groups: [staff], hosts: [127.0.0.1], ports: [%[6]d]}
`

// newRDPRig starts xrdp and Xvfb for a test that drives xfreerdp, and
// returns the rig and xrdp's port.
func newRDPRig(t *testing.T, xs testkit.XRDPSetup) (*rig, int) {
	testkit.Require(t, "xfreerdp", "Xvfb", "import", "xrdp")
	testkit.RequireRoot(t)
	r := &rig{bin: build(t), artifacts: filepath.Join("artifacts", t.Name()), consent: "y\n"}
	_ = os.RemoveAll(r.artifacts)
	rdpPort := testkit.FreePort(t)
	r.xrdp = testkit.StartXRDP(t, xs, rdpPort)
	r.display = testkit.Xvfb(t)
	return r, rdpPort
}

func setup(t *testing.T, xs testkit.XRDPSetup) *rig {
	r, rdpPort := newRDPRig(t, xs)
	dir := t.TempDir()
	_, _, cert, key := testkit.TLS(t)
	ports := testkit.FreePorts(t, 2)
	gwPort := ports[0]
	r.gw = fmt.Sprintf("127.0.0.1:%d", gwPort)
	r.cfg = filepath.Join(dir, "deskway.yaml")
	body := fmt.Sprintf(gatewayConfig, dir, ports[1], cert, key, gwPort, rdpPort)
	if err := os.WriteFile(r.cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r.gwLog = testkit.Start(t, nil, r.bin, "gateway", "-c", r.cfg)
	if err := testkit.WaitPort(r.gw, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return r
}

// xfreerdp runs the client with args and returns its exit code and output.
func (r *rig) xfreerdp(t *testing.T, timeout time.Duration, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	base := []string{"/cert:ignore", "/u:" + r.xrdp.User, "/p:" + r.xrdp.Password, "/size:800x600"}
	cmd := exec.CommandContext(ctx, "xfreerdp", append(base, args...)...)
	cmd.Env = append(os.Environ(), "DISPLAY="+r.display)
	cmd.Stdin = strings.NewReader(r.consent)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("xfreerdp: %v", err)
	}
	return code, string(out)
}

// desktop runs a full session and waits until the screenshot shows the
// host's desktop (the navy xterm), then ends the client.
func (r *rig) desktop(t *testing.T, name string, args ...string) {
	t.Helper()
	base := []string{"/cert:ignore", "/u:" + r.xrdp.User, "/p:" + r.xrdp.Password, "/size:800x600"}
	all := append(base, args...)
	if strings.HasSuffix(args[0], ".rdp") {
		all = append(append([]string{args[0]}, base...), args[1:]...) // the file comes first
	}
	untilDesktop(t, r.display, name, filepath.Join(r.artifacts, name+".png"), 45*time.Second, func(ctx context.Context) *exec.Cmd {
		return exec.CommandContext(ctx, "xfreerdp", all...)
	})
}

// untilDesktop runs the command made by start under display until a
// screenshot (kept in shot) shows the host's desktop (the navy xterm), and
// fails if it exits first or the desktop does not appear within limit
// (the login box is not the desktop); then it stops the command and
// waits for the window to go, so the next run starts from a blank screen.
func untilDesktop(t *testing.T, display, name, shot string, limit time.Duration, start func(context.Context) *exec.Cmd) {
	t.Helper()
	c := testkit.DesktopColor
	if n := testkit.CountColor(testkit.Screenshot(t, display, ""), c[0], c[1], c[2]); n > 0 {
		t.Fatalf("display shows %d desktop-colored pixels before connecting; the check would prove nothing", n)
	}
	_ = os.MkdirAll(filepath.Dir(shot), 0o755)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := start(ctx)
	cmd.Env = append(os.Environ(), "DISPLAY="+display)
	cmd.Stdin = strings.NewReader("y\n") // accept the gateway's consent message
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(limit)
	for {
		select {
		case err := <-exited:
			t.Fatalf("%s exited before the desktop appeared: %v\n%s", name, err, lastLines(out.String(), 30))
		// A desktop appears within seconds: a screenshot a second
		// added half a second to each of the run's desktops.
		case <-time.After(250 * time.Millisecond):
		}
		if n := testkit.CountColor(testkit.Screenshot(t, display, shot), c[0], c[1], c[2]); n > 50000 {
			t.Logf("%s: desktop visible (%d navy pixels), screenshot %s", name, n, shot)
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-exited // out is written until the output is closed
			t.Fatalf("%s: desktop never appeared; last screenshot in %s\n%s", name, shot, lastLines(out.String(), 30))
		}
	}
	cancel()
	<-exited
	for i := 0; i < 50; i++ {
		if testkit.CountColor(testkit.Screenshot(t, display, ""), c[0], c[1], c[2]) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func (r *rig) token(t *testing.T, ttl string, host string, port string) string {
	t.Helper()
	out, err := exec.Command(r.bin, "token", "-c", r.cfg, "--user", "gwuser", "--groups", "staff", "--host", host, "--port", port, "--ttl="+ttl).Output()
	if err != nil {
		t.Fatalf("deskway token: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// logMark is where the gateway log ends now: gatewayLogHas looks at what
// comes after it, so a line an earlier subtest caused never counts.
func (r *rig) logMark() int { return len(r.gwLog.Log.String()) }

// gatewayLogHas waits for a gateway log line after mark containing all
// parts.
func (r *rig) gatewayLogHas(t *testing.T, mark int, parts ...string) {
	t.Helper()
	for i := 0; i < 50; i++ {
		for _, line := range strings.Split(r.gwLog.Log.String()[mark:], "\n") {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(line, p)
			}
			if ok {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("gateway log has no line with %q since the subtest began\n%s", parts, lastLines(r.gwLog.Log.String()[mark:], 20))
}

func testXFreeRDPThroughGateway(t *testing.T, xs testkit.XRDPSetup) {
	r := setup(t, xs)
	_, rdpPort, _ := strings.Cut(r.xrdp.Addr, ":")
	target := "/v:" + r.xrdp.Addr
	ntlm := []string{"/g:" + r.gw, "/gu:gwuser", "/gp:Gw-Pass-123"}

	t.Run("ntlm-websocket", func(t *testing.T) {
		mark := r.logMark()
		r.desktop(t, "ntlm-websocket", append([]string{target, "/gt:http"}, ntlm...)...)
		r.gatewayLogHas(t, mark, `"tunnel open"`, `"transport":"websocket"`, `"method":"ntlm"`)
	})
	t.Run("ntlm-legacy", func(t *testing.T) {
		mark := r.logMark()
		r.desktop(t, "ntlm-legacy", append([]string{target, "/gt:http,no-websockets"}, ntlm...)...)
		r.gatewayLogHas(t, mark, `"tunnel open"`, `"transport":"legacy"`, `"method":"ntlm"`)
	})
	t.Run("paa-websocket", func(t *testing.T) {
		mark := r.logMark()
		tok := r.token(t, "5m", "127.0.0.1", rdpPort)
		r.desktop(t, "paa-websocket", target, "/g:"+r.gw, "/gat:"+tok, "/gt:http")
		r.gatewayLogHas(t, mark, `"tunnel open"`, `"transport":"websocket"`, `"method":"paa"`)
	})
	t.Run("paa-legacy", func(t *testing.T) {
		mark := r.logMark()
		tok := r.token(t, "5m", "127.0.0.1", rdpPort)
		r.desktop(t, "paa-legacy", target, "/g:"+r.gw, "/gat:"+tok, "/gt:http,no-websockets")
		r.gatewayLogHas(t, mark, `"tunnel open"`, `"transport":"legacy"`, `"method":"paa"`)
	})
	t.Run("paa-rdp-file", func(t *testing.T) {
		mark := r.logMark()
		// What mstsc reads: the gateway and token come from the .rdp file.
		tok := r.token(t, "5m", "127.0.0.1", rdpPort)
		rdp := filepath.Join(t.TempDir(), "desk.rdp")
		body := strings.Join([]string{
			"full address:s:" + r.xrdp.Addr,
			"gatewayhostname:s:" + r.gw,
			"gatewayusagemethod:i:1",
			"gatewayprofileusagemethod:i:1",
			"gatewaycredentialssource:i:5",
			"gatewayaccesstoken:s:" + tok,
			"prompt for credentials:i:0",
		}, "\r\n") + "\r\n"
		if err := os.WriteFile(rdp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		r.desktop(t, "paa-rdp-file", rdp)
		r.gatewayLogHas(t, mark, `"tunnel open"`, `"method":"paa"`, `"target":"`+r.xrdp.Addr+`"`)
	})

	refusals := []struct {
		name, want string
		args       []string
	}{
		{"wrong-password", "ERRCONNECT_ACCESS_DENIED", []string{target, "/g:" + r.gw, "/gu:gwuser", "/gp:wrong", "/gt:http"}},
		{"rap-denied-host", "E_PROXY_RAP_ACCESSDENIED", []string{"/v:127.0.0.2:" + rdpPort, "/gt:http,no-websockets", "/g:" + r.gw, "/gu:gwuser", "/gp:Gw-Pass-123"}},
		{"expired-token", "E_PROXY_COOKIE_AUTHENTICATION_ACCESS_DENIED", []string{target, "/g:" + r.gw, "/gt:http", "/gat:" + r.token(t, "-1m", "127.0.0.1", rdpPort)}},
		{"token-for-other-host", "E_PROXY_RAP_ACCESSDENIED", []string{target, "/g:" + r.gw, "/gt:http", "/gat:" + r.token(t, "5m", "127.0.0.9", rdpPort)}},
	}
	refusalsMark := r.logMark()
	for _, c := range refusals {
		t.Run(c.name, func(t *testing.T) {
			code, out := r.xfreerdp(t, 40*time.Second, append(c.args, "+auth-only")...)
			if code == 0 {
				t.Fatalf("xfreerdp succeeded; want refusal\n%s", lastLines(out, 20))
			}
			if !strings.Contains(out, c.want) {
				t.Fatalf("xfreerdp exit %d without reporting %s\n%s", code, c.want, lastLines(out, 20))
			}
		})
	}
	r.gatewayLogHas(t, refusalsMark, `"login failed"`, `"user":"gwuser"`)

	t.Run("consent-declined", func(t *testing.T) {
		r.consent = "n\n"
		defer func() { r.consent = "y\n" }()
		code, out := r.xfreerdp(t, 40*time.Second, append([]string{target, "/gt:http", "+auth-only"}, ntlm...)...)
		if code == 0 || !strings.Contains(out, "Authorized use only. Accept?") {
			t.Fatalf("declining the consent message: exit %d\n%s", code, lastLines(out, 20))
		}
	})

	t.Run("sigterm", func(t *testing.T) {
		mark := r.logMark()
		if err := r.gwLog.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.gwLog.Cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("gateway exited with %v after SIGTERM", err)
			}
		case <-time.After(40 * time.Second):
			t.Fatal("gateway did not exit after SIGTERM")
		}
		r.gatewayLogHas(t, mark, `"gateway shutting down"`)
	})
}
