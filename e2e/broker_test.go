package e2e

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/testkit"
)

const brokerConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: ["e2e-admin-token"]}
tls: {cert: %[3]s, key: %[4]s}
auth:
  token_key: "e2e-token-key-0123456789abcdef0123456789"
  users:
  - {name: %[7]s, password: "%[8]s", groups: [staff]}
gateway:
  listen: "127.0.0.1:%[5]d"
  public_name: "127.0.0.1:%[5]d"
  connection_policies:
  - {name: staff, groups: [staff], auth_methods: [paa]}
  resource_policies:
  - {name: rdp, groups: [staff], hosts: [127.0.0.1], ports: [%[6]d]}
broker:
  listen: "127.0.0.1:%[9]d"
  heartbeat_interval: 1s
  heartbeat_timeout: 10s
  # The host is the test machine, its CPUs and disk shared with the
  # clients, the browser and other test packages: their load must not turn
  # the test's launches away (health is tested on its own).
  health: {cpu_pressure_max_pct: 100, disk_idle_min_pct: 0, disk_latency_max_ms: 100000}
  delivery_groups:
  - {name: desk, groups: [staff]}
agent:
  broker: https://127.0.0.1:%[9]d
  broker_ca: %[3]s
  join_token: "%[10]s"
  name: xrdp-host
  address: 127.0.0.1
  port: %[6]d
  sessions: xrdp
  session_poll: 500ms
`

// testBrokerLaunchThroughGatewayToXRDP is the launch path end to end: the
// agent registers the xrdp host and reports its sessions, a launch returns
// an .rdp file, xfreerdp opens it through the gateway with the token in
// it, the agent reports the logon, then the disconnect, and a relaunch
// returns the same session on the same host, which xfreerdp reconnects to.
func testBrokerLaunchThroughGatewayToXRDP(t *testing.T, xs testkit.XRDPSetup) {
	b := newBrokerRig(t, xs)
	r, dir, rdpPort := b.rig, b.dir, b.rdpPort
	launch, sessionState, waitState := b.launch, b.sessionState, b.waitState
	first := launch()
	if first.Host != "xrdp-host" || first.Reconnect || first.Port != rdpPort {
		t.Fatalf("first launch = %+v", first)
	}
	if s := sessionState(); s != "launching" {
		t.Fatalf("after launch the session is %s, want launching", s)
	}
	rdp := filepath.Join(dir, "desk.rdp")
	if err := os.WriteFile(rdp, []byte(first.RDP), 0o600); err != nil {
		t.Fatal(err)
	}
	// desktop waits for the desktop, then ends xfreerdp: a disconnect.
	mark := r.logMark()
	r.desktop(t, "broker-launch", rdp, "/gt:http")
	r.gatewayLogHas(t, mark, `"tunnel open"`, `"method":"paa"`, `"target":"`+r.xrdp.Addr+`"`)
	// The agent saw the session (polling every 500 ms, it may first see it
	// active, or only once the client is gone) and then the disconnect.
	r.gatewayLogHas(t, mark, `"msg":"session event","role":"agent","user":"`+r.xrdp.User+`"`)
	waitState("disconnected")
	// The session's desktop program: a reconnect finds this same one.
	desk := userProcs(t, r.xrdp.User, "xterm")
	if len(desk) != 1 {
		t.Fatalf("%s runs %d xterms after the first launch, want 1", r.xrdp.User, len(desk))
	}
	again := launch()
	if !again.Reconnect || again.SessionID != first.SessionID || again.Host != first.Host {
		t.Fatalf("relaunch = %+v, want a reconnect to session %s", again, first.SessionID)
	}
	if err := os.WriteFile(rdp, []byte(again.RDP), 0o600); err != nil {
		t.Fatal(err)
	}
	mark = r.logMark()
	r.desktop(t, "broker-reconnect", rdp, "/gt:http")
	r.gatewayLogHas(t, mark, `"tunnel open"`, `"method":"paa"`, `"target":"`+r.xrdp.Addr+`"`)
	waitState("disconnected")
	if now := userProcs(t, r.xrdp.User, "xterm"); len(now) != 1 || now[0] != desk[0] {
		t.Fatalf("after the reconnect %s runs xterms %v, want the first session's %v: the reconnect started a new session", r.xrdp.User, now, desk)
	}
}

// brokerRig is deskway (gateway, broker and agent) in front of a real
// xrdp host, the agent reading its sessions.
type brokerRig struct {
	*rig
	t                              *testing.T
	dir                            string
	rdpPort, brokerPort, adminPort int
	hc                             *http.Client
}

func newBrokerRig(t *testing.T, xs testkit.XRDPSetup) *brokerRig { return newBrokerRigWith(t, xs, nil) }

// newBrokerRigWith is newBrokerRig with its config changed by edit.
func newBrokerRigWith(t *testing.T, xs testkit.XRDPSetup, edit func(string) string) *brokerRig {
	r, rdpPort := newRDPRig(t, xs)
	dir := t.TempDir()
	_, _, cert, key := testkit.TLS(t)
	ports := testkit.FreePorts(t, 3)
	gwPort, brokerPort, adminPort := ports[0], ports[1], ports[2]
	r.gw = fmt.Sprintf("127.0.0.1:%d", gwPort)
	r.cfg = filepath.Join(dir, "deskway.yaml")
	write := func(join string) {
		body := fmt.Sprintf(brokerConfig, dir, adminPort, cert, key, gwPort, rdpPort, r.xrdp.User, r.xrdp.Password, brokerPort, join)
		if edit != nil {
			body = edit(body)
		}
		if err := os.WriteFile(r.cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("placeholder")
	out, err := exec.Command(r.bin, "token", "join", "-c", r.cfg, "--group", "desk", "--ttl", "1h").CombinedOutput()
	if err != nil {
		t.Fatalf("deskway token join: %v %s", err, out)
	}
	write(strings.TrimSpace(string(out)))
	// In xrdp's namespace, where its agent reads the sessions of this
	// test's xrdp only.
	r.gwLog = r.xrdp.NS.Start(t, nil, r.bin, "run", "-c", r.cfg)
	// The gateway listens before the broker has migrated its store: wait for both.
	for _, addr := range []string{r.gw, fmt.Sprintf("127.0.0.1:%d", brokerPort)} {
		if err := testkit.WaitPort(addr, 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	return &brokerRig{rig: r, t: t, dir: dir, rdpPort: rdpPort, brokerPort: brokerPort, adminPort: adminPort, hc: hc}
}

// launch asks the broker for the test user's desktop, waiting while the
// agent registers.
func (b *brokerRig) launch() brokerapi.LaunchResponse {
	t := b.t
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; {
		req, _ := http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/launch", b.brokerPort), strings.NewReader(`{"delivery_group":"desk"}`))
		req.SetBasicAuth(b.xrdp.User, b.xrdp.Password)
		req.Header.Set("Content-Type", "application/json")
		resp, err := b.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			var lr brokerapi.LaunchResponse
			if err := json.Unmarshal(body, &lr); err != nil {
				t.Fatal(err)
			}
			return lr
		}
		// Only "no host can take it" (503) is the agent still registering;
		// any other answer is the launch's own failure.
		if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("launch: %d %s\n%s", resp.StatusCode, body, lastLines(b.gwLog.Log.String(), 20))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// sessionState is the broker's state of the test user's live session.
func (b *brokerRig) sessionState() string {
	t := b.t
	req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/api/v1/broker/sessions?user=%s", b.adminPort, b.xrdp.User), nil)
	req.Header.Set("Authorization", "Bearer e2e-admin-token")
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ss []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&ss); err != nil || len(ss) == 0 {
		return fmt.Sprintf("none (%v)", err)
	}
	return fmt.Sprint(ss[0]["state"])
}

func (b *brokerRig) waitState(want string) {
	t := b.t
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); b.sessionState() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("session state %s, want %s\n%s", b.sessionState(), want, lastLines(b.gwLog.Log.String(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// userProcs lists the pids of the processes of user named name.
func userProcs(t *testing.T, user, name string) []int {
	t.Helper()
	out, err := exec.Command("pgrep", "-u", user, "-x", name).Output()
	if err != nil && len(out) > 0 {
		t.Fatalf("pgrep: %v", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		var pid int
		fmt.Sscan(f, &pid)
		pids = append(pids, pid)
	}
	return pids
}
