package browserbench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/bench/xrdphost"
	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/loopback"
	"github.com/deskway/deskway/internal/tlsconf"
)

// benchUser is the session host account both clients log on as.
const benchUser = "dwbench"

// moveFlag, while it exists, makes the session's xterm move itself.
const moveFlag = "/tmp/deskway-bench-move"

// startwm is the session: one navy xterm at +40+40 that, while moveFlag
// exists, moves itself sideways 8 pixels every 30 ms (xterm's window
// operations, so no window manager is needed) and scrolls a directory
// listing, then returns to +40+40.
const startwm = `#!/bin/sh
exec xterm -xrm 'XTerm*allowWindowOps: true' -geometry 80x30+40+40 -bg navy -fg white -e sh -c '
echo DESKWAY-BENCH
while :; do
  if [ -e ` + moveFlag + ` ]; then
    x=40
    while [ -e ` + moveFlag + ` ]; do
      x=$((x+8)); [ $x -gt 560 ] && x=40
      printf "\033[3;%d;40t" $x
      ls -l /usr/bin | head -n 12
      sleep 0.03
    done
    printf "\033[3;40;40t"
  else
    sleep 0.2
  fi
done'
`

// rig is one xrdp host, a deskway gateway on its own (so its CPU is the
// gateway's alone), a broker, agent and portal beside it, and an Xvfb for
// xfreerdp.
type rig struct {
	dir                  string
	password             string
	rdpPort, gwPort      int
	adminPort, webPort   int
	brokerPort           int
	restAdminPort        int // the broker, agent and portal's admin API
	display              string
	gw, rest             *childproc.Proc
	compression          string // the gateway's browser_compression
	procs                []*childproc.Proc
	client               *http.Client
	portal, adminToken   string
	brokerURL, xrdpAddr  string
	desktopW, desktopH   int
	xrdpCertSHA256       string
	gatewayPID           int
	gatewayAdminURL      string
	frontendToken        string
	deskwayExe, tokenKey string
}

func (r *rig) close() {
	_ = os.Remove(moveFlag)
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].Stop()
	}
	_ = exec.Command("pkill", "-KILL", "-u", benchUser).Run()
}

const gatewayYAML = `state_dir: %[1]s/gw
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: ["%[3]s"]}
tls: {cert: %[1]s/tls.crt, key: %[1]s/tls.key}
auth:
  token_key: "%[4]s"
gateway:
  listen: "127.0.0.1:%[5]d"
  public_name: "127.0.0.1:%[5]d"
  browser_origins: ["https://127.0.0.1:%[6]d"]
  browser_compression: %[9]s
  connection_policies:
  - {name: bench, groups: [bench], auth_methods: [paa]}
  resource_policies:
  - {name: rdp, groups: [bench], hosts: [127.0.0.1], ports: [%[7]d], host_certificate_sha256: [%[8]s]}
`

// restYAML is the broker, agent and portal; their admin API listens on a
// port of the bench's, not the default 9443 that an installed deskway
// holds.
const restYAML = `state_dir: %[1]s/rest
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[11]d"}
tls: {cert: %[1]s/tls.crt, key: %[1]s/tls.key}
auth:
  token_key: "%[2]s"
  users:
  - {name: %[3]s, password: "%[4]s", groups: [bench]}
broker:
  listen: "127.0.0.1:%[5]d"
  gateway: "127.0.0.1:%[6]d"
  frontend_tokens: ["%[7]s"]
  heartbeat_interval: 1s
  # The browser, xfreerdp, the gateway and the host share two cores: the
  # bench measures the gateway, not whether the host has room.
  health: {cpu_pressure_max_pct: 100, disk_idle_min_pct: 0, disk_latency_max_ms: 100000}
  delivery_groups:
  - {name: desk, groups: [bench]}
agent:
  broker: https://127.0.0.1:%[5]d
  broker_ca: %[1]s/tls.crt
  join_token: "%[8]s"
  name: xrdp-host
  address: 127.0.0.1
  port: %[9]d
  sessions: xrdp
  session_poll: 500ms
web:
  listen: "127.0.0.1:%[10]d"
  title: Deskway bench
`

// setUp starts everything; close stops it, also after an error.
func (r *rig) setUp(ctx context.Context, compression string) error {
	if err := xrdphost.Check("browserbench", "the user "+benchUser, "xrdp", "xrdp-sesman", "Xvfb", "xfreerdp", "chromium", "xterm", "useradd", "chpasswd", "pkill", "import"); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r.deskwayExe = exe
	if r.xrdpCertSHA256, err = childproc.CertSHA256("/etc/xrdp/cert.pem"); err != nil {
		return fmt.Errorf("browserbench: xrdp's certificate: %w", err)
	}
	// The host account, its session and the file that moves its window.
	r.password = "Bench-" + xrdphost.Secret(12)
	if err := xrdphost.Account(benchUser, r.password, startwm); err != nil {
		return err
	}
	_ = os.Remove(moveFlag)

	ports, err := loopback.FreePorts(6)
	if err != nil {
		return err
	}
	r.rdpPort, r.gwPort, r.adminPort, r.webPort, r.brokerPort, r.restAdminPort = ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	r.xrdpAddr = fmt.Sprintf("127.0.0.1:%d", r.rdpPort)

	// xrdp on its own port, from the system's configuration.
	xrdp, err := xrdphost.StartXRDP(r.dir, r.rdpPort)
	if err != nil {
		return err
	}
	r.procs = append(r.procs, xrdp...)

	// Xvfb for xfreerdp.
	xvfb, display, err := childproc.StartXvfb()
	if err != nil {
		return fmt.Errorf("browserbench: %w", err)
	}
	r.procs = append(r.procs, xvfb)
	r.display = display

	// deskway: the gateway alone, then broker, agent and portal.
	if err := tlsconf.SelfSigned(filepath.Join(r.dir, "tls.crt"), filepath.Join(r.dir, "tls.key"), []string{"127.0.0.1"}); err != nil {
		return err
	}
	trust, err := tlsconf.Trusting(filepath.Join(r.dir, "tls.crt"))
	if err != nil {
		return err
	}
	r.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: trust}}
	r.tokenKey, r.adminToken, r.frontendToken = xrdphost.Secret(40), xrdphost.Secret(24), xrdphost.Secret(24)
	if err := r.startGateway(compression); err != nil {
		return err
	}
	r.gatewayAdminURL = fmt.Sprintf("https://127.0.0.1:%d", r.adminPort)
	restCfg := filepath.Join(r.dir, "rest.yaml")
	write := func(join string) error {
		return os.WriteFile(restCfg, []byte(fmt.Sprintf(restYAML, r.dir, r.tokenKey, benchUser, r.password, r.brokerPort, r.gwPort, r.frontendToken, join, r.rdpPort, r.webPort, r.restAdminPort)), 0o600)
	}
	if err := write("placeholder"); err != nil {
		return err
	}
	out, err := exec.Command(exe, "token", "join", "-c", restCfg, "--group", "desk", "--ttl", "1h").CombinedOutput()
	if err != nil {
		return fmt.Errorf("deskway token join: %v %s", err, out)
	}
	if err := write(strings.TrimSpace(string(out))); err != nil {
		return err
	}
	if r.rest, err = childproc.Start(nil, exe, "run", "-c", restCfg); err != nil {
		return err
	}
	r.procs = append(r.procs, r.rest)
	r.portal = fmt.Sprintf("https://127.0.0.1:%d", r.webPort)
	r.brokerURL = fmt.Sprintf("https://127.0.0.1:%d", r.brokerPort)
	for _, a := range []string{fmt.Sprintf("127.0.0.1:%d", r.gwPort), fmt.Sprintf("127.0.0.1:%d", r.brokerPort), fmt.Sprintf("127.0.0.1:%d", r.webPort)} {
		if err := loopback.WaitPort(a, 20*time.Second); err != nil {
			return fmt.Errorf("deskway: %w\n%s\n%s", err, r.gw.Tail(10), r.rest.Tail(10))
		}
	}
	// The agent registers the host; wait until a launch succeeds.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		if _, err := r.launchRDP(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fmt.Errorf("browserbench: the broker cannot launch: %w\n%s", err, r.rest.Tail(20))
		}
	}
	return nil
}

// startGateway starts the gateway, in a process of its own, with
// browser_compression set to compression.
func (r *rig) startGateway(compression string) error {
	gwCfg := filepath.Join(r.dir, "gateway.yaml")
	if err := os.WriteFile(gwCfg, []byte(fmt.Sprintf(gatewayYAML, r.dir, r.adminPort, r.adminToken, r.tokenKey, r.gwPort, r.webPort, r.rdpPort, r.xrdpCertSHA256, compression)), 0o600); err != nil {
		return err
	}
	gw, err := childproc.Start(nil, r.deskwayExe, "gateway", "-c", gwCfg)
	if err != nil {
		return err
	}
	r.gw, r.compression = gw, compression
	r.procs = append(r.procs, gw)
	r.gatewayPID = gw.Pid()
	return nil
}

// setCompression restarts the gateway with browser_compression set to
// compression, unless it runs so already. No session is open: the
// clients connect anew for each measurement.
func (r *rig) setCompression(compression string) error {
	if compression == r.compression {
		return nil
	}
	old := r.gw
	old.Stop()
	r.procs = slices.DeleteFunc(r.procs, func(p *childproc.Proc) bool { return p == old })
	if err := r.startGateway(compression); err != nil {
		return err
	}
	if err := loopback.WaitPort(fmt.Sprintf("127.0.0.1:%d", r.gwPort), 20*time.Second); err != nil {
		return fmt.Errorf("gateway restarted with browser_compression %s: %w\n%s", compression, err, r.gw.Tail(10))
	}
	return loopback.WaitPort(fmt.Sprintf("127.0.0.1:%d", r.adminPort), 20*time.Second)
}

// launchRDP asks the broker for the bench user's desktop: an .rdp file
// through the gateway with a token.
func (r *rig) launchRDP(ctx context.Context) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", r.brokerURL+"/api/v1/launch", strings.NewReader(`{"delivery_group":"desk"}`))
	req.SetBasicAuth(benchUser, r.password)
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var lr struct {
		RDP string `json:"rdp"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("launch: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&lr); err != nil {
		return "", err
	}
	return lr.RDP, nil
}

// gatewayBytes is what the gateway's open tunnels have moved, both ways,
// and what they sent their clients (for a browser, after compression).
func (r *rig) gatewayBytes(ctx context.Context) (both, toClient uint64, err error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", r.gatewayAdminURL+"/api/v1/gateway/tunnels", nil)
	req.Header.Set("Authorization", "Bearer "+r.adminToken)
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Tunnels []struct {
			Up       uint64 `json:"bytes_up"`
			Down     uint64 `json:"bytes_down"`
			ToClient uint64 `json:"bytes_to_client"`
			Open     bool   `json:"channel_open"`
		} `json:"tunnels"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, 0, err
	}
	for _, t := range body.Tunnels {
		if t.Open {
			both += t.Up + t.Down
			toClient += t.ToClient
		}
	}
	return both, toClient, nil
}
