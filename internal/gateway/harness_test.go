package gateway_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
	"github.com/deskway/deskway/internal/policy"
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
		if uses, err = gateway.NewFarmTokenUses(ctx, cfg.Farm.Database.Value(), maxUses, cfg.Gateway.ReconnectWindowD(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil); err != nil {
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

func TestMain(m *testing.M) {
	os.Exit(m.Run())
}
