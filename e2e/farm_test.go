package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tsgclient"
)

// farmNodeConfig is one node of a two-node gateway farm: the same
// certificate and token key as its peer, which it names in farm_peers.
const farmNodeConfig = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: ["e2e-admin-token"]}
tls: {cert: %[3]s, key: %[4]s}
auth:
  token_key: "e2e-token-key-0123456789abcdef0123456789"
  users:
  - {name: gwuser, password: "Gw-Pass-123", groups: [staff]}
gateway:
  listen: "127.0.0.1:%[5]d"
  farm_peers: ["127.0.0.1:%[6]d"]
  proxy_protocol_from: [127.0.0.1]   # HAProxy, on this host
  connection_policies:
  - {name: staff, groups: [staff]}
  resource_policies:
  - {name: rdp, groups: [staff], hosts: [127.0.0.1], ports: [%[7]d]}
`

// startFarmNodes starts the two gateway nodes of a farm
// (farmNodeConfig: one certificate and token key, each naming the other
// in farm_peers, their resource policy allowing rdpPort) and waits for
// both to listen. It returns their gateway ports, processes and config
// files, in the same order.
func startFarmNodes(t *testing.T, bin, cert, key string, rdpPort int) ([]int, []*testkit.Process, []string) {
	t.Helper()
	ports := []int{testkit.FreePort(t), testkit.FreePort(t)}
	var nodes []*testkit.Process
	var cfgs []string
	for i, port := range ports {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "deskway.yaml")
		body := fmt.Sprintf(farmNodeConfig, dir, testkit.FreePort(t), cert, key, port, ports[1-i], rdpPort)
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfgs = append(cfgs, cfg)
		nodes = append(nodes, testkit.Start(t, nil, bin, "gateway", "-c", cfg))
	}
	for _, port := range ports {
		if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return ports, nodes, cfgs
}

// testGatewayFarmBehindHAProxy is a farm as operators run one: two
// gateway nodes behind HAProxy with deploy/haproxy/gateway-farm.cfg
// (round robin, no persistence, TLS passed through). xfreerdp connects
// through it twice over each transport and method, every time to the
// xrdp desktop; round robin sends the two halves of each legacy
// tunnel to different nodes, which join them (HAProxy, the nodes and their
// links to each other all come from 127.0.0.1, as on one machine). The
// nodes log clients by the PROXY header's address. On the stats socket,
// HAProxy answers show info, and a node drained as docs/operations.md's
// upgrade steps say gets no new tunnel. Then one node is killed, and new
// connections still reach the desktop through the other.
func testGatewayFarmBehindHAProxy(t *testing.T, xs testkit.XRDPSetup) {
	testkit.Require(t, "haproxy")
	r, rdpPort := newRDPRig(t, xs)
	_, _, cert, key := testkit.TLS(t)
	ports, nodes, cfgs := startFarmNodes(t, r.bin, cert, key, rdpPort)
	r.cfg = cfgs[0] // for minting tokens
	// The shipped file with only its addresses changed: HAProxy reaches
	// the nodes from 127.0.0.1, the address they trust for PROXY headers,
	// and the nodes reach each other from it too.
	r.gw = fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	_, sock := shippedHAProxy(t, "gateway-farm.cfg", r.gw, "bind :443", "bind "+r.gw,
		"10.0.0.11:443", fmt.Sprintf("127.0.0.1:%d", ports[0]), "10.0.0.12:443", fmt.Sprintf("127.0.0.1:%d", ports[1]))
	if info := haproxyCommand(t, sock, "show info"); !strings.Contains(info, "Name: HAProxy") {
		t.Fatalf("the stats socket answered show info with %q", info)
	}

	target := "/v:" + r.xrdp.Addr
	ntlm := []string{"/g:" + r.gw, "/gu:gwuser", "/gp:Gw-Pass-123"}
	port := fmt.Sprint(rdpPort)
	connect := func(t *testing.T, name, transport string, token bool) {
		args := append([]string{target, "/gt:" + transport}, ntlm...)
		if token {
			args = []string{target, "/gt:" + transport, "/g:" + r.gw, "/gat:" + r.token(t, "5m", "127.0.0.1", port)}
		}
		r.desktop(t, name, args...)
	}
	// Two sessions of each kind: round robin alternates the nodes, so
	// every node serves each websocket kind and the legacy halves split.
	// Each desktop costs some 15 s on a busy machine, on the run's
	// longest chain of tests (ten of each took two minutes alone, four
	// of each over five minutes in a clean-clone run).
	const each = 2
	for _, c := range []struct {
		name, transport string
		token           bool
	}{
		{"legacy-ntlm", "http,no-websockets", false},
		{"legacy-token", "http,no-websockets", true},
		{"websocket-ntlm", "http", false},
		{"websocket-token", "http", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			for n := 1; n <= each; n++ {
				connect(t, fmt.Sprintf("farm-%s-%d", c.name, n), c.transport, c.token)
			}
		})
	}
	// Round robin split the legacy halves (xfreerdp opens the OUT half,
	// then the IN half, so they alternate between the nodes): a node
	// carried each IN half to the other, which opened the tunnel. Both
	// nodes opened tunnels.
	forwarded := 0
	for i, node := range nodes {
		log := node.Log.String()
		forwarded += strings.Count(log, "legacy IN half forwarded to the farm peer")
		if got := strings.Count(log, `"msg":"tunnel open"`); got == 0 {
			t.Errorf("node %d opened no tunnel", i+1)
		}
	}
	t.Logf("legacy IN halves forwarded between the nodes: %d of %d legacy tunnels", forwarded, 2*each)
	// The PROXY headers give the nodes the client's address: a client
	// from 127.0.0.3 with a wrong password is logged as 127.0.0.3, not as
	// HAProxy's 127.0.0.1.
	wrong := tsgclient.Config{Gateway: r.gw, TLS: &tls.Config{InsecureSkipVerify: true}, User: "gwuser", Password: "wrong",
		Transport: tsgclient.Websocket, Dial: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3)}}).DialContext}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if c, err := tsgclient.Dial(ctx, wrong, "127.0.0.1", uint16(rdpPort)); err == nil {
		c.Close()
		t.Fatal("a wrong password opened a tunnel")
	}
	eventually(t, 10*time.Second, "a node to log the client's address (127.0.0.3) for its failed login, from the PROXY header", func() (bool, string) {
		return strings.Contains(nodes[0].Log.String()+nodes[1].Log.String(), `"remote":"127.0.0.3"`), "not logged"
	})
	if forwarded < each {
		t.Errorf("only %d of %d legacy tunnels had their halves on different nodes: the test proves little", forwarded, 2*each)
	}

	// The upgrade steps of docs/operations.md: drained on the stats
	// socket, node 1 gets no new tunnel; back to ready, it is in again.
	haproxyCommand(t, sock, "set server gateways/gw1 state drain")
	if st := serverStatus(t, sock, "gateways", "gw1"); st != "DRAIN" {
		t.Fatalf("after set server gateways/gw1 state drain, gw1 is %s", st)
	}
	opened := func(i int) int { return strings.Count(nodes[i].Log.String(), `"msg":"tunnel open"`) }
	before := []int{opened(0), opened(1)}
	connect(t, "farm-drained", "http", false)
	eventually(t, 10*time.Second, "node 2 to open the tunnel, node 1 being drained", func() (bool, string) {
		return opened(1) > before[1], fmt.Sprintf("node 2 opened %d tunnels, as before", opened(1))
	})
	if opened(0) != before[0] {
		t.Error("a drained node got a new tunnel")
	}
	haproxyCommand(t, sock, "set server gateways/gw1 state ready")

	// One node dies: new connections still reach the desktop.
	if err := nodes[0].Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = nodes[0].Cmd.Wait()
	t.Run("after-a-node-died", func(t *testing.T) {
		connect(t, "farm-survivor-legacy", "http,no-websockets", true)
		connect(t, "farm-survivor-websocket", "http", false)
	})
}
