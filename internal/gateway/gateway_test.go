package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tsgclient"
)

const testConfig = `
auth:
  token_key: "0123456789abcdef0123456789abcdef"
  max_failures: 3
  users:
  - {name: alice, password: "Alice-Pass1", groups: [staff]}
  - {name: bob, password: "Bob-Pass1", groups: [staff]}
  - {name: eve, password: "Eve-Pass1", groups: [outsiders]}
  - {name: carol, password: "Carol-Pass1"}
gateway:
  listen: 127.0.0.1:0
  handshake_timeout: 2s
  keepalive: 1s
  shutdown_grace: 1s
  service_message: "Maintenance at 22:00"
  connection_policies:
  - {name: staff, groups: [staff], max_tunnels_per_user: 4}
  resource_policies:
  - {name: loop, groups: [staff], hosts: [127.0.0.1]}
`

type harness struct {
	srv       *gateway.Server
	addr      string
	clientTLS *tls.Config
	tokens    *auth.Tokens
	echo      string
	echoPort  uint16
	cancel    context.CancelFunc
	done      chan error
	logs      *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func start(t *testing.T, mod func(*config.Config)) *harness {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, clientTLS, _, _ := testkit.TLS(t)
	return startOn(t, ln, serverTLS, clientTLS, mod)
}

// startOn is start on a listener of the caller's, with its certificates
// (a farm's nodes share them), the farm key derived when the
// configuration names farm peers.
func startOn(t *testing.T, ln net.Listener, serverTLS, clientTLS *tls.Config, mod func(*config.Config)) *harness {
	t.Helper()
	cfg, err := config.Parse([]byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	if mod != nil {
		mod(cfg)
	}
	var farmKey []byte
	if len(cfg.Gateway.FarmPeers) > 0 {
		farmKey = gateway.FarmKey([]byte(cfg.Auth.TokenKey.Value()))
	}
	var uses gateway.TokenUses
	if cfg.Farm != nil {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		maxUses := 1
		if cfg.Gateway.TokenMaxUses != nil {
			maxUses = *cfg.Gateway.TokenMaxUses
		}
		var err error
		if uses, err = gateway.NewFarmTokenUses(ctx, cfg.Farm.Database.Value(), maxUses, slog.New(slog.NewTextHandler(io.Discard, nil)), nil); err != nil {
			t.Fatal(err)
		}
	}
	users, err := auth.NewUsers(cfg.Auth.Users)
	if err != nil {
		t.Fatal(err)
	}
	users.WithDesktops(cfg.Auth.DesktopAccounts)
	tokens, _ := auth.NewTokens([]byte(cfg.Auth.TokenKey.Value()), nil)
	pol, err := policy.New(cfg.Gateway, nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	h := &harness{clientTLS: clientTLS, tokens: tokens, logs: logs, done: make(chan error, 1)}
	h.srv, err = gateway.New(cfg.Gateway, gateway.Deps{
		Logger:    slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Users:     users,
		Tokens:    tokens,
		Policy:    pol,
		Throttle:  auth.NewThrottle(cfg.Auth.MaxFailures, cfg.Auth.MaxFailuresPerAddress, cfg.Auth.FailureWindow.D(), nil),
		Domain:    cfg.Auth.Domain,
		FarmKey:   farmKey,
		TokenUses: uses,
		FarmDatabase: func() string {
			if cfg.Farm == nil {
				return ""
			}
			return cfg.Farm.Database.Value()
		}(),
		Authorizer: func() gateway.Authorizer {
			if cfg.Gateway.RADIUS == nil {
				return nil
			}
			return policy.NewRADIUS(cfg.Gateway.RADIUS)
		}(),
	})
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	h.echo = testkit.Echo(t)
	_, p, _ := net.SplitHostPort(h.echo)
	fmt.Sscan(p, &h.echoPort)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.srv.Serve(ctx, ln, serverTLS) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(10 * time.Second):
			t.Error("gateway did not stop")
		}
	})
	return h
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	if testing.Verbose() {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func (h *harness) cfg(user, pass, transport string) tsgclient.Config {
	return tsgclient.Config{Gateway: h.addr, TLS: h.clientTLS, User: user, Password: pass, Transport: transport}
}

func (h *harness) token(t *testing.T, user, host string, port uint16, ttl time.Duration) string {
	t.Helper()
	s, err := h.tokens.Mint(user, nil, host, int(port), ttl)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func dial(t *testing.T, c tsgclient.Config, host string, port uint16) (*tsgclient.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return tsgclient.Dial(ctx, c, host, port)
}

func echoRoundTrip(t *testing.T, c *tsgclient.Conn, size int) {
	t.Helper()
	msg := bytes.Repeat([]byte("deskway!"), size/8+1)[:size]
	go func() { _, _ = c.Write(msg) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("echo read: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("echo mismatch")
	}
}

func TestTunnelsEcho(t *testing.T) {
	h := start(t, nil)
	for _, tr := range []string{tsgclient.Websocket, tsgclient.Legacy} {
		t.Run("ntlm-"+tr, func(t *testing.T) {
			c, err := dial(t, h.cfg("alice", "Alice-Pass1", tr), "127.0.0.1", h.echoPort)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			echoRoundTrip(t, c, 10)
			echoRoundTrip(t, c, 200000) // spans many data packets and frames
		})
		t.Run("paa-"+tr, func(t *testing.T) {
			cfg := h.cfg("", "", tr)
			cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
			c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			echoRoundTrip(t, c, 1000)
		})
	}
}

func statusOf(err error) tsgu.HRESULT {
	var se *tsgclient.StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

func httpStatusOf(err error) int {
	var he *tsgclient.HTTPError
	if errors.As(err, &he) {
		return he.Status
	}
	return 0
}

func TestRefusals(t *testing.T) {
	h := start(t, func(c *config.Config) { c.Auth.MaxFailures = 20 })
	if _, err := dial(t, h.cfg("alice", "wrong", tsgclient.Websocket), "127.0.0.1", h.echoPort); httpStatusOf(err) != 401 {
		t.Fatalf("wrong password: %v", err)
	}
	if _, err := dial(t, h.cfg("eve", "Eve-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort); statusOf(err) != tsgu.EProxyNAPAccessDenied {
		t.Fatalf("user in no CAP: %v", err)
	}
	if _, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.2", h.echoPort); statusOf(err) != tsgu.EProxyRAPAccessDenied {
		t.Fatalf("RAP-denied host: %v", err)
	}
	if _, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Legacy), "127.0.0.1", 1); statusOf(err) != tsgu.EProxyTSConnectFailed {
		t.Fatalf("closed port: %v", err)
	}
	expired := h.cfg("", "", tsgclient.Websocket)
	expired.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, -time.Minute)
	if _, err := dial(t, expired, "127.0.0.1", h.echoPort); statusOf(err) != tsgu.EProxyCookieAuthenticationDenied {
		t.Fatalf("expired token: %v", err)
	}
	forged := h.cfg("", "", tsgclient.Websocket)
	other, _ := auth.NewTokens([]byte(strings.Repeat("x", 32)), nil)
	forged.Token, _ = other.Mint("bob", nil, "127.0.0.1", int(h.echoPort), time.Minute)
	if _, err := dial(t, forged, "127.0.0.1", h.echoPort); statusOf(err) != tsgu.EProxyCookieAuthenticationDenied {
		t.Fatalf("forged token: %v", err)
	}
	wrongHost := h.cfg("", "", tsgclient.Legacy)
	wrongHost.Token = h.token(t, "bob", "127.0.0.1", h.echoPort+1, time.Minute)
	if _, err := dial(t, wrongHost, "127.0.0.1", h.echoPort); statusOf(err) != tsgu.EProxyRAPAccessDenied {
		t.Fatalf("token for another port: %v", err)
	}
	for code := range map[tsgu.HRESULT]bool{tsgu.EProxyNAPAccessDenied: true, tsgu.EProxyRAPAccessDenied: true} {
		if !code.Failed() {
			t.Fatalf("%s would read as success to FreeRDP", code)
		}
	}
}

// TestCentralPolicyRADIUS runs the gateway against a real FreeRADIUS: the
// central server can refuse a locally admitted user and grant groups.
func TestCentralPolicyRADIUS(t *testing.T) {
	radAddr, secret := testkit.FreeRADIUS(t, `alice	Auth-Type := Accept
carol	Auth-Type := Accept
	Filter-Id = "staff"
bob	Auth-Type := Reject
	Reply-Message = "account suspended"
DEFAULT	Auth-Type := Reject
`)
	h := start(t, func(c *config.Config) {
		c.Gateway.RADIUS = &config.RADIUS{Server: radAddr, Secret: config.NewSecret(secret), Timeout: config.Duration(3 * time.Second), NASIdentifier: "gw"}
	})
	c, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatalf("alice (local staff, RADIUS accept): %v", err)
	}
	echoRoundTrip(t, c, 10)
	c.Close()
	c, err = dial(t, h.cfg("carol", "Carol-Pass1", tsgclient.Legacy), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatalf("carol (staff only through RADIUS Filter-Id): %v", err)
	}
	c.Close()
	if _, err := dial(t, h.cfg("bob", "Bob-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort); statusOf(err) != tsgu.EProxyNAPAccessDenied {
		t.Fatalf("bob (RADIUS reject): %v", err)
	}
	if !strings.Contains(h.logs.String(), "account suspended") {
		t.Fatal("RADIUS reply message not logged")
	}
}

func TestLoginThrottle(t *testing.T) {
	h := start(t, nil)
	for i := 0; i < 3; i++ {
		if _, err := dial(t, h.cfg("bob", "nope", tsgclient.Websocket), "127.0.0.1", h.echoPort); httpStatusOf(err) != 401 {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	// The right password is now refused too, with 429: bob is locked at
	// this address, which he never logged in from.
	if _, err := dial(t, h.cfg("bob", "Bob-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort); httpStatusOf(err) != http.StatusTooManyRequests {
		t.Fatalf("locked-out login: %v", err)
	}
	if !strings.Contains(h.logs.String(), "failed-login throttle") || !strings.Contains(h.logs.String(), "3 failed logins as bob") {
		t.Fatal("lockout not logged with its reason")
	}
}

func TestBadTokensThrottleAddress(t *testing.T) {
	h := start(t, func(c *config.Config) { c.Auth.MaxFailuresPerAddress = 3 })
	bad := h.cfg("", "", tsgclient.Websocket)
	bad.Token = "not-a-token"
	for i := 0; i < 3; i++ {
		if _, err := dial(t, bad, "127.0.0.1", h.echoPort); statusOf(err) != tsgu.EProxyCookieAuthenticationDenied {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	good := h.cfg("", "", tsgclient.Websocket)
	good.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
	if _, err := dial(t, good, "127.0.0.1", h.echoPort); httpStatusOf(err) != http.StatusTooManyRequests {
		t.Fatalf("address with repeated bad tokens not throttled: %v", err)
	}
}

func TestMaxTunnelsPerUser(t *testing.T) {
	h := start(t, nil)
	var conns []*tsgclient.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 4; i++ {
		c, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	if _, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort); statusOf(err) != tsgu.EProxyMaxConnectionsReached {
		t.Fatalf("fifth tunnel: %v", err)
	}
}

func TestServiceMessageAndKeepalive(t *testing.T) {
	h := start(t, nil)
	cfg := h.cfg("alice", "Alice-Pass1", tsgclient.Websocket)
	var local atomic.Int32 // the client's port
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		if err == nil {
			local.Store(int32(conn.LocalAddr().(*net.TCPAddr).Port))
		}
		return conn, err
	}
	c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ServiceMessage != "Maintenance at 22:00" && c.ServiceMessage == "" {
		// The service message follows the auth response; it is read by the first Read.
		echoRoundTrip(t, c, 4)
	}
	if c.ServiceMessage != "Maintenance at 22:00" {
		t.Fatalf("service message %q", c.ServiceMessage)
	}
	// Silent until the gateway's keepalives (every second) have come
	// twice, unread: the tunnel must stay up.
	gw := portOf(t, h.addr)
	unread := func() int {
		for _, s := range tcpSocks(t) {
			if s.localPort == int(local.Load()) && s.remotePort == gw {
				return s.unread
			}
		}
		t.Fatal("the client's connection is gone")
		return 0
	}
	for first, deadline := 0, time.Now().Add(5*time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := unread()
		if first == 0 {
			first = n
		} else if n > first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second keepalive within 5 s of silence (%d bytes unread)", n)
		}
	}
	echoRoundTrip(t, c, 4)
}

func TestIdleTimeout(t *testing.T) {
	h := start(t, func(c *config.Config) {
		c.Gateway.CAP[0].IdleTimeout = config.Duration(1500 * time.Millisecond)
	})
	c, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 10)
	start := time.Now()
	if _, err := c.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("idle tunnel: read returned %v", err)
	}
	if d := time.Since(start); d < time.Second || d > 8*time.Second {
		t.Fatalf("idle close after %s", d)
	}
}

func TestSessionTimeout(t *testing.T) {
	h := start(t, func(c *config.Config) {
		c.Gateway.CAP[0].SessionTimeout = config.Duration(2 * time.Second)
	})
	c, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	// Busy all along: only the session limit can end it.
	for time.Since(start) < 10*time.Second {
		msg := []byte("ping")
		if _, err := c.Write(msg); err != nil {
			break
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := time.Since(start); d < 1500*time.Millisecond || d > 9*time.Second {
		t.Fatalf("busy tunnel ended after %s, want about the 2s session limit", d)
	}
	if !strings.Contains(h.logs.String(), "session longer than 2s") {
		t.Fatal("session timeout not logged")
	}
}

// TestMemoryBoundedUnderHugeAnnouncedPackets opens many websockets that each
// announce a maximum-size packet and send a few bytes of it: the gateway
// may buffer at most one packet per connection, not what a frame claims.
func TestMemoryBoundedUnderHugeAnnouncedPackets(t *testing.T) {
	h := start(t, func(c *config.Config) {
		c.Gateway.MaxUnauthenticatedPerAddr = 200
		// Every connection is measured while it waits: a loaded machine
		// may take longer than the test's 2 s budget to open them all.
		c.Gateway.HandshakeTimeout = config.Duration(time.Minute)
	})
	const n = 100
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var conns []*rawWS
	for i := 0; i < n; i++ {
		r := openRaw(t, h)
		// A frame claiming 1 MiB, then a packet header claiming the maximum length.
		hdr := ws.Header{Fin: true, OpCode: ws.OpBinary, Masked: true, Length: 1 << 20}
		_ = ws.WriteHeader(r.conn, hdr)
		_, _ = r.conn.Write([]byte{0x01, 0, 0, 0, 0x21, 0x00, 0x01, 0x00}) // 65569 bytes announced
		conns = append(conns, r)
	}
	waitDrained(t, h.addr, n) // the gateway has read every announcement
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	perConn := grown / n
	t.Logf("heap grew %d KiB for %d connections (%d KiB each)", grown>>10, n, perConn>>10)
	if perConn > 160<<10 {
		t.Fatalf("each connection costs %d KiB; want at most one max-size packet (64 KiB) plus TLS and HTTP buffers", perConn>>10)
	}
	for _, r := range conns {
		r.conn.Close()
	}
}

func TestAdminListAndDisconnect(t *testing.T) {
	h := start(t, nil)
	c, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echoRoundTrip(t, c, 100)
	api := httptest.NewServer(h.srv.AdminHandler())
	defer api.Close()
	resp, err := http.Get(api.URL + "/api/v1/gateway/tunnels")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Tunnels []gateway.TunnelInfo }
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Tunnels) != 1 || list.Tunnels[0].User != "alice" || list.Tunnels[0].BytesUp != 100 || list.Tunnels[0].Target != "127.0.0.1:"+fmt.Sprint(h.echoPort) {
		t.Fatalf("tunnel list: %+v", list)
	}
	req, _ := http.NewRequest(http.MethodDelete, fmt.Sprintf("%s/api/v1/gateway/tunnels/%d", api.URL, list.Tunnels[0].ID), nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("disconnect: %v %v", resp.Status, err)
	}
	if _, err := io.ReadAll(c); err != nil && !errors.Is(err, io.EOF) && !isClosed(err) {
		t.Fatalf("after disconnect: %v", err)
	}
	req, _ = http.NewRequest(http.MethodDelete, api.URL+"/api/v1/gateway/tunnels/999", nil)
	if resp, _ := http.DefaultClient.Do(req); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown tunnel: %s", resp.Status)
	}
}

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset")
}

func TestGracefulShutdown(t *testing.T) {
	h := start(t, func(c *config.Config) { c.Gateway.ShutdownGrace = config.Duration(3 * time.Second) })
	c, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h.cancel()
	// Shutdown has begun once new tunnels are refused...
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c2, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
		if err != nil {
			break
		}
		c2.Close()
		if time.Now().After(deadline) {
			t.Fatal("new tunnels still accepted 5 s after shutdown began")
		}
	}
	// ...and the open tunnel keeps working during the grace period.
	echoRoundTrip(t, c, 50)
	// ...and it is closed when the grace period ends.
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		h.done <- nil
	case <-time.After(8 * time.Second):
		t.Fatal("shutdown did not finish after the grace period")
	}
	if _, err := io.ReadAll(c); err != nil && !errors.Is(err, io.EOF) && !isClosed(err) {
		t.Fatalf("tunnel after shutdown: %v", err)
	}
}

// rawWS opens a PAA websocket with no tunnel yet, for sending arbitrary bytes.
type rawWS struct {
	conn net.Conn
	br   *bufio.Reader
}

func openRaw(t *testing.T, h *harness) *rawWS {
	t.Helper()
	conn, err := tls.Dial("tcp", h.addr, h.clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	// The key xfreerdp 2.11.7 sent in a capture: 15 characters, not base64.
	req := "RDG_OUT_DATA /remoteDesktopGateway/ HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: YYYOCV_WJLPUSG[\r\nRDG-Auth-Scheme: PAA\r\nRDG-Connection-Id: {1}\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	// SHA-1 of that key + the RFC 6455 GUID, base64 (computed independently).
	if resp.StatusCode != 101 || resp.Header.Get("Sec-WebSocket-Accept") != "f73HWLECd/1wSSxDZPcBLmC2Umo=" {
		t.Fatalf("upgrade: %s accept %q", resp.Status, resp.Header.Get("Sec-WebSocket-Accept"))
	}
	return &rawWS{conn: conn, br: br}
}

func (r *rawWS) send(t *testing.T, b []byte) {
	t.Helper()
	f := ws.MaskFrameInPlace(ws.NewBinaryFrame(append([]byte(nil), b...)))
	_ = ws.WriteFrame(r.conn, f)
}

// readUntilClose collects server packets until the connection closes.
func (r *rawWS) readUntilClose(t *testing.T) []tsgu.Message {
	t.Helper()
	_ = r.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var out []tsgu.Message
	for {
		f, err := ws.ReadFrame(r.br)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("server did not close the connection")
			}
			return out
		}
		if f.Header.OpCode == ws.OpClose {
			return out
		}
		m, err := tsgu.Decode(f.Payload)
		if err != nil {
			t.Fatalf("server sent undecodable packet %x: %v", f.Payload, err)
		}
		out = append(out, m)
	}
}

func pkt(t *testing.T, m tsgu.Message) []byte {
	b, err := m.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBadInput(t *testing.T) {
	h := start(t, nil)
	// A healthy tunnel that must not notice any of the abuse below.
	good, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	hs := pkt(t, &tsgu.HandshakeRequest{VerMajor: 1, ExtendedAuth: tsgu.ExtAuthPAA})
	cases := []struct {
		name  string
		input [][]byte
		want  tsgu.HRESULT // status in the last response, 0 for "closed without one"
		resp  tsgu.PacketType
	}{
		{"channel before handshake", [][]byte{pkt(t, &tsgu.ChannelCreate{Resources: []string{"127.0.0.1"}, Port: 3389, Protocol: 3})}, tsgu.EAccessDenied, tsgu.TypeChannelResponse},
		{"tunnel auth before tunnel", [][]byte{hs, pkt(t, &tsgu.TunnelAuth{ClientName: "x"})}, tsgu.EAccessDenied, tsgu.TypeTunnelAuthResponse},
		{"data before channel", [][]byte{hs, pkt(t, &tsgu.Data{Payload: []byte("x")})}, 0, 0},
		{"malformed tunnel create", [][]byte{hs, {0x04, 0, 0, 0, 0x0a, 0, 0, 0, 1, 2}}, tsgu.EBadArguments, tsgu.TypeTunnelResponse},
		{"tunnel create without cookie", [][]byte{hs, pkt(t, &tsgu.TunnelCreate{})}, tsgu.EProxyCookieBadPacket, tsgu.TypeTunnelResponse},
		{"garbage cookie", [][]byte{hs, func() []byte { m := &tsgu.TunnelCreate{}; m.SetCookieString("garbage"); return pkt(t, m) }()}, tsgu.EProxyCookieAuthenticationDenied, tsgu.TypeTunnelResponse},
		{"oversized length", [][]byte{{0x01, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f}}, 0, 0},
		{"length below header", [][]byte{{0x01, 0, 0, 0, 0x02, 0, 0, 0}}, 0, 0},
		{"unknown type", [][]byte{{0x77, 0, 0, 0, 0x08, 0, 0, 0}}, 0, 0},
		{"wrong version", [][]byte{pkt(t, &tsgu.HandshakeRequest{VerMajor: 9, ExtendedAuth: tsgu.ExtAuthPAA})}, tsgu.EProxyCapabilityMismatch, tsgu.TypeHandshakeResponse},
		{"no PAA on unauthenticated HTTP", [][]byte{pkt(t, &tsgu.HandshakeRequest{VerMajor: 1})}, tsgu.EProxyUnsupportedAuthenticationMeth, tsgu.TypeHandshakeResponse},
		{"split across frames", [][]byte{hs[:3], hs[3:], pkt(t, &tsgu.TunnelCreate{})}, tsgu.EProxyCookieBadPacket, tsgu.TypeTunnelResponse},
		{"truncated then silent", [][]byte{hs[:5]}, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := openRaw(t, h)
			defer r.conn.Close()
			for _, b := range c.input {
				r.send(t, b)
			}
			got := r.readUntilClose(t)
			if c.want == 0 {
				for _, m := range got {
					if m.Type() != tsgu.TypeHandshakeResponse {
						t.Fatalf("unexpected %s", m.Type())
					}
				}
				return
			}
			if len(got) == 0 {
				t.Fatalf("closed without a %s", c.resp)
			}
			last := got[len(got)-1]
			if last.Type() != c.resp {
				t.Fatalf("last packet %s, want %s", last.Type(), c.resp)
			}
			var code tsgu.HRESULT
			switch m := last.(type) {
			case *tsgu.HandshakeResponse:
				code = m.ErrorCode
			case *tsgu.TunnelResponse:
				code = m.StatusCode
			case *tsgu.TunnelAuthResponse:
				code = m.ErrorCode
			case *tsgu.ChannelResponse:
				code = m.ErrorCode
			}
			if code != c.want {
				t.Fatalf("status %s, want %s", code, c.want)
			}
		})
	}
	echoRoundTrip(t, good, 1000)
}

func TestSlowAndIdleClients(t *testing.T) {
	h := start(t, nil)
	before := runtime.NumGoroutine()
	var conns []net.Conn
	// Slow headers: half a request line, then nothing.
	for i := 0; i < 20; i++ {
		c, err := tls.Dial("tcp", h.addr, h.clientTLS)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, "RDG_OUT_DATA /remoteDesk")
		conns = append(conns, c)
	}
	// Plain TCP that never starts TLS.
	for i := 0; i < 20; i++ {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Upgraded websocket that never sends a packet.
	for i := 0; i < 20; i++ {
		conns = append(conns, openRaw(t, h).conn)
	}
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(6 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("an idle or slow connection was not closed by the handshake timeout")
			}
		}
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+5 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+5 {
		t.Fatalf("goroutines grew from %d to %d", before, n)
	}
}

func TestLegacyPairing(t *testing.T) {
	h := start(t, nil)
	// An OUT half for alice.
	out := rawLegacy(t, h, "RDG_OUT_DATA", "{pair-1}", "alice", "Alice-Pass1")
	if out == nil {
		t.Fatal("OUT half refused")
	}
	defer out.Close()
	// Bob reuses alice's connection id for his IN half: refused.
	in := rawLegacy(t, h, "RDG_IN_DATA", "{pair-1}", "bob", "Bob-Pass1")
	if in != nil {
		t.Fatal("IN half of another user joined alice's OUT half")
	}
	// Alice's own IN half joins.
	in = rawLegacy(t, h, "RDG_IN_DATA", "{pair-1}", "alice", "Alice-Pass1")
	if in == nil {
		t.Fatal("alice's IN half refused")
	}
	defer in.Close()
	// A second IN for an id already paired: refused.
	if again := rawLegacy(t, h, "RDG_IN_DATA", "{pair-1}", "alice", "Alice-Pass1"); again != nil {
		t.Fatal("second IN half accepted")
	}
	// PAA over the legacy pair (no identity in HTTP) pairs, as xfreerdp needs.
	p := h.cfg("", "", tsgclient.Legacy)
	p.Token = h.token(t, "alice", "127.0.0.1", h.echoPort, time.Minute)
	c, err := dial(t, p, "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatalf("PAA over legacy: %v", err)
	}
	defer c.Close()
	echoRoundTrip(t, c, 300)
}

// rawLegacy authenticates one legacy half with NTLM and returns the
// connection if the gateway accepted it.
func rawLegacy(t *testing.T, h *harness, method, id, user, pass string) net.Conn {
	t.Helper()
	conn, resp, err := tsgclient.OpenLegacyHalf(context.Background(), h.cfg(user, pass, tsgclient.Legacy), method, id)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	if resp != nil && resp.StatusCode != http.StatusOK {
		conn.Close()
		return nil
	}
	return conn
}

func TestMain(m *testing.M) {
	os.Exit(m.Run())
}

// TestBulkBothWaysWithASlowReader sends more than the socket buffers hold
// while the client does not read, so the relay must hold back each side
// in turn (its queues fill, then drain) without losing or reordering a
// byte. It runs on the event loops and on goroutines.
func TestBulkBothWaysWithASlowReader(t *testing.T) {
	for _, loops := range []int{2, 0} {
		t.Run(fmt.Sprintf("relay_loops=%d", loops), func(t *testing.T) {
			h := start(t, func(c *config.Config) { c.Gateway.RelayLoops = &loops })
			url := admin(t, h)
			cfg := h.cfg("", "", tsgclient.Websocket)
			cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
			c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			msg := make([]byte, 24<<20)
			rng := rand.New(rand.NewChaCha8([32]byte{7}))
			for i := range msg {
				msg[i] = byte(rng.Uint32())
			}
			werr := make(chan error, 1)
			go func() { _, err := c.Write(msg); werr <- err }()
			waitStalled(t, h, url, uint64(len(msg))) // everything on the way fills up
			got := make([]byte, len(msg))
			stuck := time.AfterFunc(30*time.Second, func() { c.Close() })
			defer stuck.Stop()
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatalf("read back: %v", err)
			}
			if err := <-werr; err != nil {
				t.Fatalf("write: %v", err)
			}
			if !bytes.Equal(got, msg) {
				i := 0
				for i < len(msg) && got[i] == msg[i] {
					i++
				}
				t.Fatalf("echo differs from byte %d on", i)
			}
			echoRoundTrip(t, c, 10) // still usable after the burst
		})
	}
}

// TestPingFloodIsHeldBack opens a channel by hand and then sends pings
// without ever reading the pongs: the gateway must stop reading such a
// client once its answers back up, not queue them without end.
func TestPingFloodIsHeldBack(t *testing.T) {
	h := start(t, nil)
	r := openRaw(t, h)
	defer r.conn.Close()
	tc := &tsgu.TunnelCreate{}
	tc.SetCookieString(h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute))
	for _, m := range []tsgu.Message{
		&tsgu.HandshakeRequest{VerMajor: 1, ExtendedAuth: tsgu.ExtAuthPAA}, tc, &tsgu.TunnelAuth{ClientName: "flood"},
		&tsgu.ChannelCreate{Resources: []string{"127.0.0.1"}, Port: h.echoPort, Protocol: 3},
	} {
		r.send(t, pkt(t, m))
	}
	_ = r.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := ws.ReadFrame(r.br)
		if err != nil {
			t.Fatalf("waiting for the channel: %v", err)
		}
		if m, err := tsgu.Decode(f.Payload); err == nil && m.Type() == tsgu.TypeChannelResponse {
			break
		}
	}
	ping := ws.MaskFrameInPlace(ws.NewPingFrame(bytes.Repeat([]byte("p"), 125)))
	var frame bytes.Buffer
	_ = ws.WriteFrame(&frame, ping)
	burst := bytes.Repeat(frame.Bytes(), 1000)
	const limit = 64 << 20
	sent := 0
	for sent < limit {
		_ = r.conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, err := r.conn.Write(burst)
		sent += n
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Logf("held back after %d MiB of pings", sent>>20)
				return
			}
			t.Fatalf("write: %v", err)
		}
	}
	t.Fatalf("the gateway read %d MiB of pings whose answers nobody read", sent>>20)
}

// TestReloadPutsUsersAndPoliciesInForce: a reload's users can log in and
// its policies decide the next tunnel; an open tunnel keeps its grant.
func TestReloadPutsUsersAndPoliciesInForce(t *testing.T) {
	h := start(t, nil)
	open, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := dial(t, h.cfg("zoe", "Zoe-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort); httpStatusOf(err) != http.StatusUnauthorized {
		t.Fatalf("zoe before she was added: %v, want 401", err)
	}
	cfg := &config.Config{Auth: config.Auth{Users: []config.User{
		{Name: "alice", Password: config.NewSecret("Alice-Pass1"), Groups: []string{"staff"}},
		{Name: "zoe", Password: config.NewSecret("Zoe-Pass1"), Groups: []string{"night"}},
	}}, Gateway: &config.Gateway{
		CAP: []config.CAP{{Name: "night", Groups: []string{"night"}}},
		RAP: []config.RAP{{Name: "loop", Groups: []string{"night"}, Hosts: []string{"127.0.0.1"}}},
	}}
	cfg.ApplyDefaults()
	users, err := auth.NewUsers(cfg.Auth.Users)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.New(cfg.Gateway, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.Reload(users, pol)
	c, err := dial(t, h.cfg("zoe", "Zoe-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatalf("zoe after the reload: %v", err)
	}
	echoRoundTrip(t, c, 10)
	c.Close()
	// staff has no policy now: alice logs in but gets no new tunnel...
	if _, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.1", h.echoPort); statusOf(err) != tsgu.EProxyNAPAccessDenied {
		t.Fatalf("alice, with no connection policy for her group: %v, want E_PROXY_NAP_ACCESSDENIED", err)
	}
	// ...and the one she had goes on.
	echoRoundTrip(t, open, 10)
}
