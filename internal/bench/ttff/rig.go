package ttff

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/deskway/deskway/internal/bench/xrdphost"
	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/loopback"
	"github.com/deskway/deskway/internal/tlsconf"
)

// hostUser is the session host account every client logs on as.
const hostUser = "dwttff"

// gatewayUser is the gateway's own account, for NTLM.
const gatewayUser = "gwttff"

// startwm is the session: one navy xterm at +40+40, the colour the
// first frame is recognised by.
const startwm = `#!/bin/sh
exec xterm -geometry 80x30+40+40 -bg navy -fg white
`

// rig is one xrdp host, HAProxy relaying TCP to it, a deskway gateway
// in front of it, and an Xvfb for xfreerdp, all on loopback.
type rig struct {
	dir, exe           string
	hostPass, gwPass   string
	rdpPort, relayPort int
	gwPort, adminPort  int
	display            string
	// x stays connected for the whole run: Xvfb resets when its last
	// client leaves, and would refuse the next for a moment.
	x     *xgb.Conn
	root  xproto.Window
	gw    *childproc.Proc
	procs []*childproc.Proc
}

func (r *rig) close() {
	if r.x != nil {
		r.x.Close()
	}
	for i := len(r.procs) - 1; i >= 0; i-- {
		r.procs[i].Stop()
	}
	_ = exec.Command("pkill", "-KILL", "-u", hostUser).Run()
}

// gatewayYAML offers both of the gateway's authentications to xfreerdp:
// NTLM with the gateway's own account, and PAA with a token. Its admin
// API listens on a port of the bench's, not the default 9443 that an
// installed deskway holds.
const gatewayYAML = `state_dir: %[1]s/gw
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[6]d"}
tls: {cert: %[1]s/tls.crt, key: %[1]s/tls.key}
auth:
  token_key: "%[2]s"
  users:
  - {name: ` + gatewayUser + `, password: "%[3]s", groups: [bench]}
gateway:
  listen: "127.0.0.1:%[4]d"
  auth_methods: [ntlm, paa]
  connection_policies:
  - {name: bench, groups: [bench]}
  resource_policies:
  - {name: rdp, groups: [bench], hosts: [127.0.0.1], ports: [%[5]d]}
`

// haproxyCfg relays TCP as a plain hop: one thread, no inspection.
const haproxyCfg = `global
  nbthread 1
defaults
  mode tcp
  timeout connect 5s
  timeout client 1h
  timeout server 1h
frontend rdp
  bind 127.0.0.1:%d
  default_backend host
backend host
  server xrdp 127.0.0.1:%d
`

// setUp starts everything; close stops it, also after an error.
func (r *rig) setUp() error {
	if err := xrdphost.Check("ttff", "the user "+hostUser, "xrdp", "xrdp-sesman", "Xvfb", "xfreerdp", "xterm", "strace", "haproxy", "useradd", "chpasswd", "pkill"); err != nil {
		return err
	}
	var err error
	if r.exe, err = os.Executable(); err != nil {
		return err
	}
	if err := r.hostAccount(); err != nil {
		return err
	}
	ports, err := loopback.FreePorts(4)
	if err != nil {
		return err
	}
	r.rdpPort, r.relayPort, r.gwPort, r.adminPort = ports[0], ports[1], ports[2], ports[3]
	if err := r.startXRDP(); err != nil {
		return err
	}
	xvfb, display, err := childproc.StartXvfb()
	if err != nil {
		return fmt.Errorf("ttff: %w", err)
	}
	r.procs = append(r.procs, xvfb)
	r.display = display
	xgb.Logger.SetOutput(io.Discard) // Xvfb takes local clients without a cookie
	if r.x, err = xgb.NewConnDisplay(display); err != nil {
		return fmt.Errorf("ttff: X display %s: %w", display, err)
	}
	r.root = xproto.Setup(r.x).DefaultScreen(r.x).Root

	hcfg := filepath.Join(r.dir, "haproxy.cfg")
	if err := os.WriteFile(hcfg, []byte(fmt.Sprintf(haproxyCfg, r.relayPort, r.rdpPort)), 0o600); err != nil {
		return err
	}
	lb, err := childproc.Start(nil, "haproxy", "-db", "-f", hcfg)
	if err != nil {
		return err
	}
	r.procs = append(r.procs, lb)

	if err := tlsconf.SelfSigned(filepath.Join(r.dir, "tls.crt"), filepath.Join(r.dir, "tls.key"), []string{"127.0.0.1"}); err != nil {
		return err
	}
	r.gwPass = "Gw-" + xrdphost.Secret(12)
	cfg := fmt.Sprintf(gatewayYAML, r.dir, xrdphost.Secret(40), r.gwPass, r.gwPort, r.rdpPort, r.adminPort)
	if err := os.WriteFile(r.gatewayConfig(), []byte(cfg), 0o600); err != nil {
		return err
	}
	if r.gw, err = childproc.Start(nil, r.exe, "gateway", "-c", r.gatewayConfig()); err != nil {
		return err
	}
	r.procs = append(r.procs, r.gw)
	for _, p := range []int{r.relayPort, r.gwPort} {
		if err := loopback.WaitPort(fmt.Sprintf("127.0.0.1:%d", p), 20*time.Second); err != nil {
			return fmt.Errorf("ttff: %w\nhaproxy: %s\ngateway: %s", err, lb.Tail(10), r.gw.Tail(10))
		}
	}
	return nil
}

func (r *rig) gatewayConfig() string { return filepath.Join(r.dir, "gateway.yaml") }

// hostAccount adds the host user with a fresh password and its session.
func (r *rig) hostAccount() error {
	r.hostPass = "Ttff-" + xrdphost.Secret(12)
	return xrdphost.Account(hostUser, r.hostPass, startwm)
}

// startXRDP starts the session manager and xrdp, on its own port, from
// the system's configuration.
func (r *rig) startXRDP() error {
	procs, err := xrdphost.StartXRDP(r.dir, r.rdpPort)
	r.procs = append(r.procs, procs...)
	return err
}

// token mints a PAA token for the host, as `deskway token` does.
func (r *rig) token() (string, error) {
	out, err := exec.Command(r.exe, "token", "-c", r.gatewayConfig(), "--user", gatewayUser, "--groups", "bench",
		"--host", "127.0.0.1", "--port", strconv.Itoa(r.rdpPort), "--ttl", "10m").Output()
	if err != nil {
		return "", fmt.Errorf("deskway token: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
