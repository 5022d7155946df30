package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// TestShippedFarmSkipsADeadNodeAtOnce is the shipped farm file's word
// that "a connection that finds it dead first is sent to another node",
// checked: behind deploy/haproxy/gateway-farm.cfg, a connection that
// round robin gives to a node that has just died (before its health
// checks find it down) reaches the other node, and HAProxy counts a
// redispatch for it, never a retry of the dead node (each of which
// would cost the client a second's pause first: HAProxy waits that long
// before trying the same server again). gw1's health checks are
// switched off before it is killed, so HAProxy counts it up however
// slowly this machine runs.
func TestShippedFarmSkipsADeadNodeAtOnce(t *testing.T) {
	parallel(t)
	testkit.Require(t, "haproxy")
	bin := build(t)
	_, _, cert, key := testkit.TLS(t)
	// No RDP host is reached: the resource policy's port is unused.
	ports, nodes, _ := startFarmNodes(t, bin, cert, key, testkit.FreePort(t))
	gw := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	_, sock := shippedHAProxy(t, "gateway-farm.cfg", gw, "bind :443", "bind "+gw,
		"10.0.0.11:443", fmt.Sprintf("127.0.0.1:%d", ports[0]), "10.0.0.12:443", fmt.Sprintf("127.0.0.1:%d", ports[1]))
	eventually(t, 20*time.Second, "both nodes up in HAProxy's show stat", func() (bool, string) {
		a, b := serverStatus(t, sock, "gateways", "gw1"), serverStatus(t, sock, "gateways", "gw2")
		return a == "UP" && b == "UP", fmt.Sprintf("gw1 %s, gw2 %s", a, b)
	})
	haproxyCommand(t, sock, "disable health gateways/gw1")
	if err := nodes[0].Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = nodes[0].Cmd.Wait()

	// Round robin hands two of four new connections to gw1, still up.
	for i := range 4 {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", gw, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatalf("connection %d through HAProxy after gw1 died: %v", i+1, err)
		}
		c.Close()
	}
	f := serverStat(t, sock, "gateways", "gw1")
	if f[15] != "0" {
		t.Errorf("HAProxy retried the dead gw1 itself %s times (wretr) before sending the connection to gw2: want 0, each costs the client a second", f[15])
	}
	if f[16] == "0" || f[16] == "" {
		t.Errorf("no connection was redispatched from the dead gw1 (wredis %q): round robin should have given it two of four", f[16])
	}
	t.Logf("gw1 after its death: wretr %s, wredis %s, status %s", f[15], f[16], f[17])
}
