package gateway_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/tsgclient"
)

// waitExpired waits until the gateway's verifier (with its leeway) says
// tok has expired.
func waitExpired(t *testing.T, h *harness, tok string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := h.tokens.Verify(tok)
		if errors.Is(err, auth.ErrTokenExpired) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the token has not expired after 15 s: %v", err)
		}
	}
}

// tokenFrom is a websocket client of h presenting tok from address src.
func tokenFrom(h *harness, tok, src string) tsgclient.Config {
	c := h.cfg("", "", tsgclient.Websocket)
	c.Token = tok
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c.Dial = d.DialContext
	return c
}

// refusedFor dials h with cfg to port and wants the gateway to refuse
// with code, for reason as its log gives it.
func refusedFor(t *testing.T, h *harness, cfg tsgclient.Config, port uint16, code tsgu.HRESULT, why, reason string) {
	t.Helper()
	before := strings.Count(h.logs.String(), reason)
	_, err := dial(t, cfg, "127.0.0.1", port)
	if statusOf(err) != code {
		t.Fatalf("%s: %v, want status %#x", why, err, uint32(code))
	}
	waitLogged(t, reason, before+1, 2*time.Second, h)
}

// TestExpiredTokenReconnectsWithinItsWindow: a client whose link drops
// after its token expired reconnects with that token (its auto-reconnect
// has no other) to its own target, from its own address, until an
// administrator's disconnect spends it; an expired token that never
// opened a tunnel, one from another address and one asking for another
// target are refused, as before.
func TestExpiredTokenReconnectsWithinItsWindow(t *testing.T) {
	const denied = tsgu.EProxyCookieAuthenticationDenied
	h := start(t, nil) // the default window, 10 minutes
	url := admin(t, h)
	tok := h.token(t, "alice", "127.0.0.1", h.echoPort, time.Second)
	unused := h.token(t, "alice", "127.0.0.1", h.echoPort, time.Second)
	c, err := dial(t, tokenFrom(h, tok, "127.0.0.1"), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	echoRoundTrip(t, c, 100)
	waitExpired(t, h, tok)
	// The tunnel outlives the token: a second one at once is refused.
	refusedFor(t, h, tokenFrom(h, tok, "127.0.0.1"), h.echoPort, denied, "the expired token while its tunnel is open",
		"token is in use by an open tunnel")
	echoRoundTrip(t, c, 100)
	c.Close()
	waitGone(t, url, 4*time.Second, "after the link dropped")

	c, err = dial(t, tokenFrom(h, tok, "127.0.0.1"), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatalf("the client's reconnect with its expired token, within the window: %v", err)
	}
	echoRoundTrip(t, c, 100)
	waitLogged(t, "expired token's reconnect granted", 1, 2*time.Second, h)
	c.Close()
	waitGone(t, url, 4*time.Second, "after the reconnected tunnel ended")

	refusedFor(t, h, tokenFrom(h, unused, "127.0.0.1"), h.echoPort, denied, "an expired token that never opened a tunnel",
		"token has expired and opened no tunnel")
	refusedFor(t, h, tokenFrom(h, tok, "127.0.0.7"), h.echoPort, denied, "the expired token from another address",
		"token was first used from 127.0.0.1; it is not accepted from 127.0.0.7")
	other := tokenFrom(h, tok, "127.0.0.1")
	refusedFor(t, h, other, h.echoPort+1, tsgu.EProxyRAPAccessDenied, "the expired token to another port",
		fmt.Sprintf("token allows 127.0.0.1:%d", h.echoPort))

	// An administrator's disconnect of the reconnected tunnel spends the
	// token, expired or not.
	c, err = dial(t, tokenFrom(h, tok, "127.0.0.1"), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatalf("the third tunnel of a token for three (the refused ones gave their uses back): %v", err)
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
	refusedFor(t, h, tokenFrom(h, tok, "127.0.0.1"), h.echoPort, denied, "the expired token after an administrator's disconnect",
		"an administrator disconnected this token's tunnel")
}

// TestReconnectWindowCountsFromTheLastClose: the window runs from the
// close of the token's last tunnel, and refused tries meanwhile (from
// another address, to another target) do not extend it.
func TestReconnectWindowCountsFromTheLastClose(t *testing.T) {
	const window = 12 * time.Second
	h := start(t, func(c *config.Config) { w := config.Duration(window); c.Gateway.ReconnectWindow = &w })
	url := admin(t, h)
	tok := h.token(t, "alice", "127.0.0.1", h.echoPort, time.Second)
	c, err := dial(t, tokenFrom(h, tok, "127.0.0.1"), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	echoRoundTrip(t, c, 10)
	c.Close()
	waitGone(t, url, 4*time.Second, "after the link dropped")
	closedBy := time.Now() // the gateway recorded the close before this
	waitExpired(t, h, tok)
	if time.Since(closedBy) > window-time.Second {
		t.Fatalf("the token took %s to expire, too long to try within an %s window (a 1 s token)", time.Since(closedBy), window)
	}
	refusedFor(t, h, tokenFrom(h, tok, "127.0.0.7"), h.echoPort, tsgu.EProxyCookieAuthenticationDenied,
		"the expired token from another address", "it is not accepted from 127.0.0.7")
	refusedFor(t, h, tokenFrom(h, tok, "127.0.0.1"), h.echoPort+1, tsgu.EProxyRAPAccessDenied,
		"the expired token to another port", "token allows")
	// Past the window from the close, and well within one from the
	// refused tries.
	time.Sleep(time.Until(closedBy.Add(window + 500*time.Millisecond)))
	refusedFor(t, h, tokenFrom(h, tok, "127.0.0.1"), h.echoPort, tsgu.EProxyCookieAuthenticationDenied,
		"the expired token past its window", "its last tunnel closed more than gateway.reconnect_window (12s) ago")
}

// TestExpiredTokenReconnectMeetsTodaysPolicy: the reconnect grant is no
// pass around the policies: a user removed from the configuration after
// her tunnel closed (her group with her) gets no reconnect with her
// expired token.
func TestExpiredTokenReconnectMeetsTodaysPolicy(t *testing.T) {
	h := start(t, nil)
	url := admin(t, h)
	tok := h.token(t, "alice", "127.0.0.1", h.echoPort, time.Second)
	c, err := dial(t, tokenFrom(h, tok, "127.0.0.1"), "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	echoRoundTrip(t, c, 10)
	c.Close()
	waitGone(t, url, 4*time.Second, "after the link dropped")
	waitExpired(t, h, tok)
	cfg, err := config.Parse([]byte(strings.Replace(testConfig,
		`  - {name: alice, password: "Alice-Pass1", groups: [staff]}`+"\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	users, err := auth.NewUsers(cfg.Auth.Users)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.New(cfg.Gateway, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.Reload(users, pol)
	if _, err := dial(t, tokenFrom(h, tok, "127.0.0.1"), "127.0.0.1", h.echoPort); statusOf(err) != tsgu.EProxyNAPAccessDenied {
		t.Fatalf("alice's expired token after she was removed: %v, want E_PROXY_NAP_ACCESSDENIED", err)
	}
}
