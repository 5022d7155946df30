package gateway_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/tsgclient"
)

// viaBalancer dials as a load balancer with send-proxy-v2 does: the
// PROXY v2 header naming client first, then the client's bytes.
func viaBalancer(client string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return viaBalancerFrom("", client)
}

// TestProxyProtocolKeepsClientsApart: behind a load balancer every
// connection comes from the balancer's address. Without the PROXY
// protocol, one client's failed logins lock the balancer's address, and
// with it everyone's logins (the first half shows it on a gateway that
// does not trust the balancer). With proxy_protocol_from, the gateway
// sees each client's own address: the attacker is locked out, another
// user is not, and the log names the real addresses.
func TestProxyProtocolKeepsClientsApart(t *testing.T) {
	spray := func(h *harness, dial func(context.Context, string, string) (net.Conn, error)) {
		for i := 0; i < 3; i++ {
			c := h.cfg("bob", "wrong", tsgclient.Websocket)
			c.Dial = dial
			if _, err := dialCfg(t, c, h.echoPort); httpStatusOf(err) != http.StatusUnauthorized {
				t.Fatalf("spray %d: %v", i, err)
			}
		}
	}
	throttled := func(c *config.Config) { c.Auth.MaxFailuresPerAddress = 3 }

	plainGW := start(t, throttled)
	spray(plainGW, nil)
	if _, err := dialCfg(t, plainGW.cfg("alice", "Alice-Pass1", tsgclient.Websocket), plainGW.echoPort); httpStatusOf(err) != http.StatusTooManyRequests {
		t.Fatalf("without the PROXY protocol, alice from the same balancer address: %v (want 429, the lock-out this test guards against)", err)
	}

	h := start(t, func(c *config.Config) {
		throttled(c)
		c.Gateway.ProxyProtocolFrom = []string{"127.0.0.0/8"}
	})
	spray(h, viaBalancer("192.0.2.66:40000"))
	alice := h.cfg("alice", "Alice-Pass1", tsgclient.Websocket)
	alice.Dial = viaBalancer("192.0.2.10:40001")
	c, err := dialCfg(t, alice, h.echoPort)
	if err != nil {
		t.Fatalf("alice, another client behind the same balancer: %v", err)
	}
	echoRoundTrip(t, c, 100)
	c.Close()
	bob := h.cfg("bob", "Bob-Pass1", tsgclient.Websocket)
	bob.Dial = viaBalancer("192.0.2.66:40002")
	if _, err := dialCfg(t, bob, h.echoPort); httpStatusOf(err) != http.StatusTooManyRequests {
		t.Fatalf("the sprayer's address, even with the right password: %v, want 429", err)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "192.0.2.10") || !strings.Contains(logs, "192.0.2.66") {
		t.Fatal("the log does not name the clients behind the balancer")
	}

	// From the trusted balancer, a connection without a header is closed.
	if _, err := dialCfg(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), h.echoPort); err == nil {
		t.Fatal("a connection from the balancer's address without a PROXY header was served")
	}
	if !strings.Contains(h.logs.String(), "no valid PROXY protocol v2 header") {
		t.Fatal("the missing header was not logged")
	}
}

func dialCfg(t *testing.T, c tsgclient.Config, port uint16) (*tsgclient.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return tsgclient.Dial(ctx, c, "127.0.0.1", port)
}
