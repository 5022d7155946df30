package gateway_test

import (
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/proxyv2"
	"github.com/deskway/deskway/internal/tsgclient"
)

// viaBalancerFrom dials from the local address from (any, if empty), as
// a load balancer with send-proxy-v2 does: a PROXY v2 header naming
// client first.
func viaBalancerFrom(from, client string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		if from != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
		}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		src := netip.MustParseAddrPort(client)
		hdr := append([]byte{}, proxyv2.Signature...)
		hdr = append(hdr, 0x21, 0x11, 0, 12)
		s4, d4 := src.Addr().As4(), [4]byte{127, 0, 0, 1}
		hdr = append(append(hdr, s4[:]...), d4[:]...)
		hdr = binary.BigEndian.AppendUint16(hdr, src.Port())
		hdr = binary.BigEndian.AppendUint16(hdr, 443)
		if _, err := c.Write(hdr); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// TestFarmBehindABalancerOnTheNodesHost: the balancer shares the nodes'
// address (one host, or one NAT), so the nodes trust that address for
// PROXY headers and their links to each other come from it too, with no
// header. The legacy halves of a client behind the balancer, on two
// nodes, still join: the link proves itself with the farm key. That
// address gives nothing else: a client on the balancer's host that
// skips the header is refused, a claim on such a connection needs the
// farm key as anywhere, and a PROXY header from an address the nodes do
// not trust names no one.
func TestFarmBehindABalancerOnTheNodesHost(t *testing.T) {
	nodes := startFarm(t, 2, func(c *config.Config) { c.Gateway.ProxyProtocolFrom = []string{"127.0.0.1/32"} })
	a, b := nodes[0], nodes[1]

	var n atomic.Int32
	via := viaBalancerFrom("127.0.0.1", "192.0.2.10:40000")
	client := a.cfg("alice", "Alice-Pass1", tsgclient.Legacy)
	client.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		to := b.addr // the IN half
		if n.Add(1) == 1 {
			to = a.addr // the OUT half
		}
		return via(ctx, network, to)
	}
	c, err := dial(t, client, "127.0.0.1", a.echoPort)
	if err != nil {
		t.Fatalf("halves on two nodes behind a balancer on their host: %v\nnode A:\n%s\nnode B:\n%s", err, a.logs.String(), b.logs.String())
	}
	echoRoundTrip(t, c, 10_000)
	c.Close()
	if !strings.Contains(b.logs.String(), "legacy IN half forwarded to the farm peer holding its OUT half") {
		t.Fatal("node B did not forward the IN half")
	}

	// A client on the balancer's host, without the header: refused,
	// though its password is right, on each transport.
	for _, transport := range []string{tsgclient.Websocket, tsgclient.Legacy} {
		bare := a.cfg("alice", "Alice-Pass1", transport)
		if c, err := dialCfg(t, bare, a.echoPort); err == nil {
			c.Close()
			t.Fatalf("%s: a client from the balancer's address without a PROXY header was served", transport)
		} else if httpStatusOf(err) != http.StatusForbidden {
			t.Fatalf("%s: a client from the balancer's address without a PROXY header: %v, want 403", transport, err)
		}
	}
	if !strings.Contains(a.logs.String(), "without a PROXY header, where only farm peers' links are served") {
		t.Fatal("the refusal was not logged")
	}
	// A claim on such a connection needs the farm key, as anywhere.
	if status := rawClaim(t, a, "{nobody}", "ntlm", "alice", "127.0.0.1", time.Now().Unix(), "AAAA"); status != http.StatusUnauthorized {
		t.Fatalf("a forged claim from the balancer's address: %d, want 401", status)
	}

	// A PROXY header from an address the nodes do not trust: the bytes
	// fail the TLS handshake, and no one is named.
	spoofed := a.cfg("alice", "Alice-Pass1", tsgclient.Websocket)
	spoofed.Dial = viaBalancerFrom("127.0.0.2", "192.0.2.99:40000")
	if c, err := dialCfg(t, spoofed, a.echoPort); err == nil {
		c.Close()
		t.Fatal("a PROXY header from an untrusted address was taken")
	}
	if strings.Contains(a.logs.String(), "192.0.2.99") {
		t.Fatal("the node took the client address an untrusted PROXY header named")
	}
}
