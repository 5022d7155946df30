package gateway_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/tsgclient"
)

// TestTokensAreNotReplayable: a PAA token opens one tunnel; with
// reconnects allowed, more only from the address of its first use, one
// at a time, up to the limit. Whoever sees a token cannot use it too.
func TestTokensAreNotReplayable(t *testing.T) {
	from := func(h *harness, tok, src string) tsgclient.Config {
		c := h.cfg("", "", tsgclient.Websocket)
		c.Token = tok
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c.Dial = d.DialContext
		return c
	}
	// refused dials with cfg and wants the token refused for reason, as
	// the gateway's log gives it: the client is told the status alone,
	// the same for a token in use, used up or from another address.
	refused := func(t *testing.T, h *harness, cfg tsgclient.Config, port uint16, why, reason string) {
		t.Helper()
		before := strings.Count(h.logs.String(), reason)
		_, err := dial(t, cfg, "127.0.0.1", port)
		if statusOf(err) != tsgu.EProxyCookieAuthenticationDenied {
			t.Fatalf("%s: %v, want E_PROXY_COOKIE_AUTHENTICATION_ACCESS_DENIED", why, err)
		}
		waitLogged(t, reason, before+1, 2*time.Second, h)
	}
	const (
		inUse   = "token is in use by an open tunnel"
		usedUp1 = "token has opened the 1 tunnels it may"
		usedUp3 = "token has opened the 3 tunnels it may"
	)
	one := func(c *config.Config) { n := 1; c.Gateway.TokenMaxUses = &n }
	t.Run("one tunnel", func(t *testing.T) {
		h := start(t, one)
		url := admin(t, h)
		tok := h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
		c, err := dial(t, from(h, tok, "127.0.0.1"), "127.0.0.1", h.echoPort)
		if err != nil {
			t.Fatal(err)
		}
		echoRoundTrip(t, c, 10)
		refused(t, h, from(h, tok, "127.0.0.1"), h.echoPort, "the same token while its tunnel is open", inUse)
		c.Close()
		waitGone(t, url, 4*time.Second, "after the client closed its tunnel")
		refused(t, h, from(h, tok, "127.0.0.1"), h.echoPort, "the same token after its tunnel ended", usedUp1)
		if !strings.Contains(h.logs.String(), "token of bob refused") {
			t.Fatal("the replay was not logged with its reason")
		}
	})
	t.Run("reconnects", func(t *testing.T) {
		h := start(t, nil) // the default allows three
		url := admin(t, h)
		tok := h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
		for i := range 3 {
			if i == 1 {
				refused(t, h, from(h, tok, "127.0.0.7"), h.echoPort, "a reconnect from another address",
					"token was first used from 127.0.0.1; it is not accepted from 127.0.0.7")
			}
			c, err := dial(t, from(h, tok, "127.0.0.1"), "127.0.0.1", h.echoPort)
			if err != nil {
				t.Fatalf("reconnect %d from the first address: %v", i, err)
			}
			echoRoundTrip(t, c, 10)
			c.Close()
			waitGone(t, url, 4*time.Second, "after the client closed its tunnel")
		}
		refused(t, h, from(h, tok, "127.0.0.1"), h.echoPort, "a fourth tunnel with a token for three", usedUp3)
	})
	// An administrator's disconnect spends the token: the client's
	// auto-reconnect, which the default of three uses allows after a
	// dropped link, would otherwise undo it at once.
	t.Run("disconnected by an administrator", func(t *testing.T) {
		h := start(t, nil)
		url := admin(t, h)
		tok := h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
		c, err := dial(t, from(h, tok, "127.0.0.1"), "127.0.0.1", h.echoPort)
		if err != nil {
			t.Fatal(err)
		}
		echoRoundTrip(t, c, 10)
		list := tunnels(t, url)
		if len(list) != 1 {
			t.Fatalf("tunnels: %+v, want one", list)
		}
		req, _ := http.NewRequest("DELETE", fmt.Sprintf("%s/api/v1/gateway/tunnels/%d", url, list[0].ID), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("admin disconnect: %v %v", resp, err)
		}
		resp.Body.Close()
		c.Close()
		waitGone(t, url, 4*time.Second, "after the administrator's disconnect")
		refused(t, h, from(h, tok, "127.0.0.1"), h.echoPort, "the client reconnecting after an administrator's disconnect",
			"an administrator disconnected this token's tunnel")
	})
	// A tunnel whose host cannot be reached never used its token: the
	// client may try again (from any address, as the failed try bound it
	// to none), and only a tunnel that opened spends it.
	t.Run("host down", func(t *testing.T) {
		h := start(t, one)
		url := admin(t, h)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(ln.Addr().(*net.TCPAddr).Port)
		ln.Close() // the host is down
		tok := h.token(t, "bob", "127.0.0.1", port, time.Minute)
		if _, err := dial(t, from(h, tok, "127.0.0.7"), "127.0.0.1", port); statusOf(err) != tsgu.EProxyTSConnectFailed {
			t.Fatalf("a tunnel to a host that is down: %v, want E_PROXY_TS_CONNECTFAILED", err)
		}
		ln, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { _, _ = io.Copy(c, c); c.Close() }()
			}
		}()
		waitGone(t, url, 4*time.Second, "after the tunnel to a host that was down")
		c, err := dial(t, from(h, tok, "127.0.0.1"), "127.0.0.1", port)
		if err != nil {
			t.Fatalf("the token after its only tunnel could not reach the host: %v", err)
		}
		echoRoundTrip(t, c, 10)
		c.Close()
		waitGone(t, url, 4*time.Second, "after the client closed its tunnel")
		refused(t, h, from(h, tok, "127.0.0.1"), port, "the token after a tunnel opened and ended", usedUp1)
	})
}

// TestLoginThrottleBySourceAndFamiliarity: failures count where the
// password is checked, per address and per user at an address; failures
// from addresses that never logged in as a user do not lock that user out
// of the addresses they work from; a correct password refused while
// locked is no failure.
func TestLoginThrottleBySourceAndFamiliarity(t *testing.T) {
	h := start(t, func(c *config.Config) {
		c.Auth.MaxFailures = 3
		c.Auth.MaxFailuresPerAddress = 20
		for i := range 40 {
			c.Auth.Users = append(c.Auth.Users, config.User{Name: fmt.Sprintf("user%d", i), Password: config.NewSecret(fmt.Sprintf("User%d-Pass1", i))})
		}
	})
	login := func(src, user, pass string) error {
		c := h.cfg(user, pass, tsgclient.Websocket)
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c.Dial = d.DialContext
		conn, err := dial(t, c, "127.0.0.1", h.echoPort)
		if err == nil {
			conn.Close()
		}
		return err
	}
	t.Run("spray from one address", func(t *testing.T) {
		stopped := -1
		for i := range 40 {
			err := login("127.0.0.2", fmt.Sprintf("user%d", i), "Winter2026!")
			if httpStatusOf(err) == http.StatusTooManyRequests {
				stopped = i
				break
			}
			if httpStatusOf(err) != http.StatusUnauthorized {
				t.Fatalf("guess %d: %v", i, err)
			}
		}
		if stopped != 20 {
			t.Fatalf("the spray was stopped at guess %d, want 20 (max_failures_per_address)", stopped)
		}
		// The address stays refused even for a right password.
		if err := login("127.0.0.2", "user39", "User39-Pass1"); httpStatusOf(err) != http.StatusTooManyRequests {
			t.Fatalf("right password from the spraying address: %v", err)
		}
		// A client that reads the answer learns when to try again.
		d := &tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}, Config: h.clientTLS}
		conn, err := d.DialContext(context.Background(), "tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "RDG_OUT_DATA /remoteDesktopGateway/ HTTP/1.1\r\nHost: gw\r\nRDG-Auth-Scheme: PAA\r\nRDG-Connection-Id: {2}\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != http.StatusTooManyRequests || err != nil || secs < 1 {
			t.Fatalf("the spraying address: %s, Retry-After %q; want 429 with a number of seconds", resp.Status, resp.Header.Get("Retry-After"))
		}
	})
	t.Run("smart lockout", func(t *testing.T) {
		if err := login("127.0.0.1", "alice", "Alice-Pass1"); err != nil { // alice's office
			t.Fatal(err)
		}
		for range 10 {
			_ = login("127.0.0.3", "alice", "guess")
		}
		if err := login("127.0.0.3", "alice", "Alice-Pass1"); httpStatusOf(err) != http.StatusTooManyRequests {
			t.Fatalf("alice from the attacker's address after 10 failures: %v", err)
		}
		if err := login("127.0.0.1", "alice", "Alice-Pass1"); err != nil {
			t.Fatalf("failures elsewhere locked alice out of her office: %v", err)
		}
		// From a new address alice is refused (locked for unfamiliar
		// addresses), however often she tries: refusals are not failures,
		// so that address is not locked for anyone else.
		for range 25 {
			if err := login("127.0.0.4", "alice", "Alice-Pass1"); httpStatusOf(err) != http.StatusTooManyRequests {
				t.Fatalf("alice from a new address while locked: %v", err)
			}
		}
		if err := login("127.0.0.4", "bob", "Bob-Pass1"); err != nil {
			t.Fatalf("refused logins locked their address for another user: %v", err)
		}
	})
}
