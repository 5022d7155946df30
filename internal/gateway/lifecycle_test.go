package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/tsgclient"
)

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
	// The closing line comes after the client sees the end (a loaded
	// machine showed the gap).
	waitLogged(t, "session longer than 2s (session timeout)", 1, 5*time.Second, h)
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
