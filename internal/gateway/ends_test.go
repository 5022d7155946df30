package gateway_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/tsgclient"
)

func TestEndsReachTheClientWithTheirReason(t *testing.T) {
	h := start(t, func(c *config.Config) {
		c.Gateway.CAP[0].IdleTimeout = config.Duration(2 * time.Second)
	})
	url := admin(t, h)
	open := func(port uint16) *tsgclient.Conn {
		cfg := h.cfg("", "", tsgclient.Websocket)
		cfg.Token = h.token(t, "bob", "127.0.0.1", port, time.Minute)
		c, err := dial(t, cfg, "127.0.0.1", port)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	readToEnd := func(c *tsgclient.Conn) {
		done := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, c); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the tunnel did not end")
		}
	}
	t.Run("admin", func(t *testing.T) {
		c := open(h.echoPort)
		echoRoundTrip(t, c, 10)
		list := tunnels(t, url)
		disconnect(t, url, list[0].ID)
		readToEnd(c)
		if c.CloseStatus != tsgu.EProxyConnectionAborted || !strings.Contains(c.ServiceMessage, "administrator") {
			t.Fatalf("close status %s, message %q", c.CloseStatus, c.ServiceMessage)
		}
	})
	t.Run("idle, with the host sending all along", func(t *testing.T) {
		// Only the client's input counts: a desktop that keeps drawing
		// does not keep an unattended session alive.
		c := open(source(t, 200*time.Millisecond))
		start := time.Now()
		readToEnd(c)
		if d := time.Since(start); d > 6*time.Second {
			t.Fatalf("idle timeout of 2s fired after %s", d)
		}
		if c.CloseStatus == 0 || c.CloseStatus == tsgu.EProxySessionTimeout || c.CloseStatus == tsgu.EProxyConnectionAborted {
			t.Fatalf("idle close status %s, want one of its own", c.CloseStatus)
		}
		if !strings.Contains(c.ServiceMessage, "idle") {
			t.Fatalf("message %q", c.ServiceMessage)
		}
	})
}

// TestSessionTimeoutHasItsOwnStatus: a session that outlives the
// policy's session timeout ends with E_PROXY_SESSIONTIMEOUT however busy
// its user is, and the client is told why.
func TestSessionTimeoutHasItsOwnStatus(t *testing.T) {
	h := start(t, func(c *config.Config) {
		c.Gateway.CAP[0].SessionTimeout = config.Duration(2 * time.Second)
	})
	cfg := h.cfg("", "", tsgclient.Websocket)
	cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
	// The gateway starts the session's clock before the dial returns:
	// the session may not end sooner than 2 s after the dial began.
	start := time.Now()
	c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, c); close(done) }()
	// The user types all along: only the session timeout can end it.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(10 * time.Second)
	for ended := false; !ended; {
		select {
		case <-done:
			ended = true
		case <-tick.C:
			_, _ = c.Write([]byte("key"))
		case <-limit:
			t.Fatal("a session timeout of 2s did not end the tunnel")
		}
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Fatalf("the session ended after %s, before its timeout", d)
	}
	if c.CloseStatus != tsgu.EProxySessionTimeout || !strings.Contains(c.ServiceMessage, "session") {
		t.Fatalf("close status %s, message %q; want E_PROXY_SESSIONTIMEOUT and why", c.CloseStatus, c.ServiceMessage)
	}
}

// TestLogLinesNameTheUserOnce and print IPv6 endpoints with brackets.
func TestLogLinesNameTheUserOnceAndIPv6InBrackets(t *testing.T) {
	h := start(t, nil)
	// alice (NTLM) asks for a host no policy allows: refused after her
	// identity is known.
	if _, err := dial(t, h.cfg("alice", "Alice-Pass1", tsgclient.Websocket), "127.0.0.2", 3389); statusOf(err) != tsgu.EProxyRAPAccessDenied {
		t.Fatalf("a host outside the policy: %v, want E_PROXY_RAP_ACCESSDENIED", err)
	}
	// bob's token is for ::1; he asks for another host.
	cfg := h.cfg("", "", tsgclient.Websocket)
	cfg.Token = h.token(t, "bob", "::1", 3389, time.Minute)
	if _, err := dial(t, cfg, "127.0.0.1", 3389); statusOf(err) != tsgu.EProxyRAPAccessDenied {
		t.Fatalf("a token used for another host: %v, want E_PROXY_RAP_ACCESSDENIED", err)
	}
	// Every line of the two tunnels is in once both closing lines are.
	waitLogged(t, "tunnel closed", 2, 2*time.Second, h)
	logs := h.logs.String()
	for _, line := range strings.Split(logs, "\n") {
		if strings.Count(line, " user=") > 1 {
			t.Errorf("user named twice: %s", line)
		}
	}
	if !strings.Contains(logs, "token allows [::1]:3389") {
		t.Errorf("IPv6 endpoint not in brackets:\n%s", logs)
	}
}
