package faults

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/agent"
	"github.com/deskway/deskway/internal/bench/xrdphost"
	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/loopback"
	"github.com/deskway/deskway/internal/tlsconf"
)

// gwUserPrefix names the host accounts the gateway scenario logs on:
// dwfault01, dwfault02…
const gwUserPrefix = "dwfault"

// Each client's screen is exactly its desktop's size, so that the
// desktop covers it wherever xfreerdp puts its window.
const (
	screenW, screenH = 400, 300
	// clientDisplays are the X displays of the clients' Xvfbs: above
	// the ranges xrdp's sessions (10…), the e2e tests (90…139) and the
	// other benches (150…199) use.
	firstClientDisplay = 210
)

// sessionWM is each user's desktop: an xterm whose background changes
// colour four times a second, so that its client is sent a frame every
// quarter of a second for as long as the session runs and reaches it.
// The colours all have red 0x20 and green 0x40, and differ in blue
// (watch looks for them).
const sessionWM = `#!/bin/sh
exec xterm -geometry 120x50+0+0 -bg '#204060' -fg white -e sh -c 'i=0; while :; do i=$((i+1)); case $((i%4)) in 0) c=60;; 1) c=90;; 2) c=c0;; *) c=f0;; esac; printf "\033]11;#2040%s\007%s\n" $c $i; sleep 0.25; done'
`

// nodeYAML is one node of the farm: both share the token key and the
// certificate, and each names the other in farm_peers. A stopped node
// lets its tunnels run for shutdown_grace (shortened from 30 s so that a
// run does not wait on it). token_max_uses is left at its default (3),
// which a farm whose clients reconnect needs: with one, a legacy client
// whose tunnel was on the surviving node (its IN half carried by the dead
// one) is refused as a replay when it reconnects there.
const nodeYAML = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: ["%[3]s"]}
tls: {cert: %[4]s/tls.crt, key: %[4]s/tls.key}
auth:
  token_key: "%[5]s"
gateway:
  listen: "127.0.0.1:%[6]d"
  public_name: "%[7]s"
  farm_peers: ["127.0.0.1:%[8]d"]
  proxy_protocol_from: [127.0.0.1]
  shutdown_grace: 5s
  connection_policies:
  - {name: faults, groups: [faults], auth_methods: [paa]}
  resource_policies:
  - {name: rdp, groups: [faults], hosts: [127.0.0.1], ports: [%[9]d]}
`

// haproxyCfg is deploy/haproxy/gateway-farm.cfg with the bench's
// addresses: round robin without persistence, TLS passed through, PROXY
// v2 headers, health checks every 2 s, a dead server's connections
// redispatched. It logs at info, not notice, so that each connection's
// line (which node it reached, how long it lasted) is in the rig's log.
const haproxyCfg = `global
  maxconn 2000
  log stderr format raw local0 info
  stats socket %[1]s mode 600 level admin
  stats timeout 30s

defaults
  mode tcp
  log global
  option tcplog
  option redispatch
  retries 2
  timeout connect 5s
  timeout client 1h
  timeout server 1h

frontend rdgateway
  bind %[2]s
  default_backend gateways

backend gateways
  balance roundrobin
  option httpchk GET /healthz
  http-check expect status 200
  default-server send-proxy-v2 check check-ssl check-send-proxy verify none inter 2s fall 2 rise 2
  server gw1 %[3]s
  server gw2 %[4]s
`

// gwRig is an xrdp host with one account per client, a farm of two
// gateway nodes behind HAProxy, and per client an Xvfb and an xfreerdp
// connected with the .rdp file the broker hands out.
type gwRig struct {
	env        Env
	dir        string
	password   string
	users      []string
	rdpPort    int
	lbAddr     string
	sock       string
	adminToken string
	client     *http.Client
	nodes      [2]*gwNode
	lb         *childproc.Proc
	xrdp       []*childproc.Proc
	clients    []*gwClient
	displays   [2]int
}

// gwNode is one gateway node of the farm.
type gwNode struct {
	name, cfg, addr, admin string
	proc                   *childproc.Proc
}

// setUp starts xrdp, the two nodes and HAProxy, and prepares n users.
func (r *gwRig) setUp(n int) error {
	if err := xrdphost.Check("faults", "the users "+gwUserPrefix+"01…", "xrdp", "xrdp-sesman", "Xvfb", "xfreerdp", "xterm", "haproxy", "stdbuf", "useradd", "chpasswd", "pkill", "pgrep"); err != nil {
		return err
	}
	r.password = "Fault-" + xrdphost.Secret(12)
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("%s%02d", gwUserPrefix, i)
		if err := xrdphost.Account(name, r.password, sessionWM); err != nil {
			return err
		}
		r.users = append(r.users, name)
	}
	ports, err := loopback.FreePorts(6)
	if err != nil {
		return err
	}
	r.rdpPort = ports[0]
	if err := r.startXRDP(); err != nil {
		return err
	}
	if err := tlsconf.SelfSigned(filepath.Join(r.dir, "tls.crt"), filepath.Join(r.dir, "tls.key"), []string{"127.0.0.1"}); err != nil {
		return err
	}
	trust, err := tlsconf.Trusting(filepath.Join(r.dir, "tls.crt"))
	if err != nil {
		return err
	}
	r.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: trust}}
	r.adminToken = xrdphost.Secret(24)
	tokenKey := xrdphost.Secret(40)
	r.lbAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
	gwPorts, adminPorts := ports[2:4], ports[4:6]
	for i := range r.nodes {
		dir := filepath.Join(r.dir, fmt.Sprintf("gw%d", i+1))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		nd := &gwNode{name: fmt.Sprintf("gw%d", i+1), cfg: filepath.Join(dir, "deskway.yaml"),
			addr: fmt.Sprintf("127.0.0.1:%d", gwPorts[i]), admin: fmt.Sprintf("127.0.0.1:%d", adminPorts[i])}
		body := fmt.Sprintf(nodeYAML, dir, adminPorts[i], r.adminToken, r.dir, tokenKey, gwPorts[i], r.lbAddr, gwPorts[1-i], r.rdpPort)
		if err := os.WriteFile(nd.cfg, []byte(body), 0o600); err != nil {
			return err
		}
		r.nodes[i] = nd
		if err := r.startNode(i); err != nil {
			return err
		}
	}
	r.sock = filepath.Join(r.dir, "haproxy.sock")
	cfg := filepath.Join(r.dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(haproxyCfg, r.sock, r.lbAddr, r.nodes[0].addr, r.nodes[1].addr)), 0o600); err != nil {
		return err
	}
	if r.lb, err = childproc.Start(nil, "haproxy", "-db", "-f", cfg); err != nil {
		return err
	}
	// Its stats socket, not only the port (which another program could
	// have taken since FreePorts), says it runs.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(r.sock); err == nil {
			break
		}
		select {
		case <-r.lb.Exited():
			return fmt.Errorf("faults: haproxy ended: %s", r.lb.Tail(10))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("faults: haproxy made no stats socket within 10 s: %s", r.lb.Tail(10))
		}
	}
	if err := loopback.WaitPort(r.lbAddr, 10*time.Second); err != nil {
		return fmt.Errorf("faults: haproxy: %w\n%s", err, r.lb.Tail(10))
	}
	for _, nd := range r.nodes {
		if err := r.waitServer(nd.name, "UP", 20*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// startNode starts node i and waits for its port.
func (r *gwRig) startNode(i int) error {
	nd := r.nodes[i]
	if nd.proc != nil {
		// The killed node's log holds what its tunnels did when it died:
		// it stays beside the log of the node started in its place.
		_ = os.WriteFile(filepath.Join(r.dir, nd.name+"-killed.log"), []byte(nd.proc.Output()), 0o644)
	}
	p, err := childproc.Start(nil, r.env.Bin, "gateway", "-c", nd.cfg)
	if err != nil {
		return err
	}
	nd.proc = p
	if err := loopback.WaitPort(nd.addr, 20*time.Second); err != nil {
		return fmt.Errorf("faults: gateway node %s: %w\n%s", nd.name, err, p.Tail(10))
	}
	return nil
}

// startXRDP starts xrdp on the rig's port and its session manager, from
// the system's configuration.
func (r *gwRig) startXRDP() error {
	sesman, err := os.ReadFile("/etc/xrdp/sesman.ini")
	if err != nil {
		return err
	}
	r.displays = [2]int{10, 60}
	if m := regexp.MustCompile(`(?m)^X11DisplayOffset=(\d+)`).FindSubmatch(sesman); m != nil {
		r.displays[0], _ = strconv.Atoi(string(m[1]))
		r.displays[1] = r.displays[0] + 50
	}
	childproc.RemoveStaleX(r.displays[0], r.displays[1])
	if r.xrdp, err = xrdphost.StartXRDP(r.dir, r.rdpPort); err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	return nil
}

// refusals is what the nodes logged refusing user's tunnels.
func (r *gwRig) refusals(user string) []string {
	var out []string
	for _, nd := range r.nodes {
		for _, l := range strings.Split(nd.proc.Output(), "\n") {
			if (strings.Contains(l, `"user":"`+user+`"`) || strings.Contains(l, "token of "+user+" ")) && strings.Contains(l, "refused") && !slices.Contains(out, l) {
				out = append(out, nd.name+": "+l)
			}
		}
	}
	return out
}

// sessions is each user's xrdp sessions as the agent reports them: the
// X display and the X server's process, which a new session would not
// share with the old.
func (r *gwRig) sessions() (map[string][]string, error) {
	usage, err := agent.ReadSessionUsage("/proc")
	if err != nil {
		return nil, fmt.Errorf("faults: reading xrdp's sessions: %w", err)
	}
	out := map[string][]string{}
	for _, u := range usage {
		pids, _ := exec.Command("pgrep", "-u", u.User, "-x", "Xorg").Output()
		out[u.User] = append(out[u.User], ":"+u.Display+" Xorg "+strings.Join(strings.Fields(string(pids)), ","))
	}
	for _, s := range out {
		slices.Sort(s)
	}
	return out, nil
}

// haproxy sends one command to HAProxy's stats socket and returns the
// answer.
func (r *gwRig) haproxy(cmd string) (string, error) {
	c, err := net.DialTimeout("unix", r.sock, 5*time.Second)
	if err != nil {
		return "", fmt.Errorf("faults: HAProxy's stats socket: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return "", fmt.Errorf("faults: %s: %w", cmd, err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		return "", fmt.Errorf("faults: %s: %w", cmd, err)
	}
	return string(out), nil
}

// waitServer waits until HAProxy's "show stat" gives server the status
// want (UP, DRAIN, DOWN).
func (r *gwRig) waitServer(server, want string, d time.Duration) error {
	got := ""
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := r.haproxy("show stat")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Split(line, ","); len(f) > 17 && f[0] == "gateways" && f[1] == server {
				got = f[17]
			}
		}
		if got == want {
			return nil
		}
	}
	return fmt.Errorf("faults: HAProxy shows %s %q after %v, not %s", server, got, d, want)
}

// close stops everything the rig started and ends its users' sessions;
// HAProxy's and the nodes' logs stay in the rig's directory (for as
// long as the caller keeps it).
func (r *gwRig) close() {
	for _, c := range r.clients {
		c.close()
	}
	if r.lb != nil {
		r.lb.Stop()
		_ = os.WriteFile(filepath.Join(r.dir, "haproxy.log"), []byte(r.lb.Output()), 0o644)
	}
	for _, nd := range r.nodes {
		if nd != nil && nd.proc != nil {
			nd.proc.Stop()
			_ = os.WriteFile(filepath.Join(r.dir, nd.name+".log"), []byte(nd.proc.Output()), 0o644)
		}
	}
	for i := len(r.xrdp) - 1; i >= 0; i-- {
		r.xrdp[i].Stop()
	}
	for _, u := range r.users {
		_ = exec.Command("pkill", "-KILL", "-u", u).Run()
	}
	childproc.RemoveStaleX(r.displays[0], r.displays[1])
	childproc.RemoveStaleX(firstClientDisplay, firstClientDisplay+len(r.users))
}
