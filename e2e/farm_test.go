package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
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
  proxy_protocol_from: [127.0.0.2]
  connection_policies:
  - {name: staff, groups: [staff]}
  resource_policies:
  - {name: rdp, groups: [staff], hosts: [127.0.0.1], ports: [%[7]d]}
`

// TestGatewayFarmBehindHAProxy is a farm as operators run one: two
// gateway nodes behind HAProxy with deploy/haproxy/gateway-farm.cfg
// (round robin, no persistence, TLS passed through). xfreerdp connects
// through it ten times over each transport and method, every time to the
// xrdp desktop; round robin sends the two halves of each legacy tunnel
// to different nodes, which join them. Then one node is killed, and new
// connections still reach the desktop through the other.
func TestGatewayFarmBehindHAProxy(t *testing.T) {
	testkit.Require(t, "haproxy")
	r, rdpPort := newRDPRig(t)
	_, _, cert, key := testkit.TLS(t)
	ports := []int{testkit.FreePort(t), testkit.FreePort(t)}
	var nodes []*testkit.Process
	for i, port := range ports {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "deskway.yaml")
		body := fmt.Sprintf(farmNodeConfig, dir, testkit.FreePort(t), cert, key, port, ports[1-i], rdpPort)
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			r.cfg = cfg // for minting tokens
		}
		nodes = append(nodes, testkit.Start(t, nil, r.bin, "gateway", "-c", cfg))
	}
	for _, port := range ports {
		if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	lbPort := testkit.FreePort(t)
	r.gw = fmt.Sprintf("127.0.0.1:%d", lbPort)
	example, err := os.ReadFile("../deploy/haproxy/gateway-farm.cfg")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(example), "bind :443", "bind "+r.gw, 1)
	// HAProxy reaches the nodes from an address of its own, the one they
	// trust for PROXY headers; the nodes reach each other from another.
	cfg = strings.Replace(cfg, "  balance roundrobin\n", "  balance roundrobin\n  source 127.0.0.2\n", 1)
	servers := regexp.MustCompile(`(?m)^  server .*\n`)
	if n := len(servers.FindAllString(cfg, -1)); n != 2 {
		t.Fatalf("the example names %d servers, want 2", n)
	}
	i := 0
	cfg = servers.ReplaceAllStringFunc(cfg, func(string) string {
		i++
		return fmt.Sprintf("  server gw%d 127.0.0.1:%d\n", i, ports[i-1])
	})
	lbCfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(lbCfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	lb := testkit.Start(t, nil, "haproxy", "-db", "-f", lbCfg)
	if err := testkit.WaitPort(r.gw, 10*time.Second); err != nil {
		t.Fatalf("haproxy: %v\n%s", err, lb.Log.String())
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
	const each = 10
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
	// The PROXY headers gave the nodes the client's address (xfreerdp's,
	// 127.0.0.1), not HAProxy's (127.0.0.2).
	for i, node := range nodes {
		if log := node.Log.String(); strings.Contains(log, `"remote":"127.0.0.2"`) || !strings.Contains(log, `"remote":"127.0.0.1"`) {
			t.Errorf("node %d logged tunnels from HAProxy's address rather than the client's", i+1)
		}
	}
	if forwarded < each {
		t.Errorf("only %d of %d legacy tunnels had their halves on different nodes: the test proves little", forwarded, 2*each)
	}

	// One node dies: new connections still reach the desktop.
	if err := nodes[0].Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = nodes[0].Cmd.Wait()
	t.Run("after-a-node-died", func(t *testing.T) {
		for n := 1; n <= 3; n++ {
			connect(t, fmt.Sprintf("farm-survivor-legacy-%d", n), "http,no-websockets", n%2 == 0)
		}
		connect(t, "farm-survivor-websocket", "http", false)
	})
}
