package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/tsgclient"
)

// These tests reproduce attacks on a gateway serving real TLS on
// loopback: clients that never read, hosts that never read, floods of
// unauthenticated connections, and connections kept alive past the time
// the gateway gives anyone to authenticate.

// admin serves the admin API of h for the test.
func admin(t *testing.T, h *harness) string {
	api := httptest.NewServer(h.srv.AdminHandler())
	t.Cleanup(api.Close)
	return api.URL
}

// tunnels lists h's tunnels through the admin API.
func tunnels(t *testing.T, url string) []gateway.TunnelInfo {
	t.Helper()
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url + "/api/v1/gateway/tunnels")
	if err != nil {
		t.Fatalf("admin list: %v", err)
	}
	defer resp.Body.Close()
	var list struct{ Tunnels []gateway.TunnelInfo }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	return list.Tunnels
}

// disconnect asks the admin API to close tunnel id and says how long the
// answer took; it fails the test if there was none within 3s.
func disconnect(t *testing.T, url string, id uint32) time.Duration {
	t.Helper()
	c := &http.Client{Timeout: 3 * time.Second}
	req, _ := http.NewRequest(http.MethodDelete, fmt.Sprintf("%s/api/v1/gateway/tunnels/%d", url, id), nil)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("admin disconnect of tunnel %d did not answer: %v", id, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("admin disconnect of tunnel %d: %s", id, resp.Status)
	}
	return time.Since(start)
}

// waitGone waits until no tunnel is listed, or fails after d.
func waitGone(t *testing.T, url string, d time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		n := len(tunnels(t, url))
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d tunnels still listed after %s", what, n, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStopped fails unless the gateway's Serve returns within d of now.
func waitStopped(t *testing.T, h *harness, d time.Duration) {
	t.Helper()
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		h.done <- nil // for the harness's cleanup
	case <-time.After(d):
		t.Fatalf("shutdown did not finish within %s", d)
	}
}

// pingFlood upgrades an unauthenticated PAA websocket (no token, ever)
// and sends ping frames until the gateway stops taking them, never
// reading a pong. It returns once the flood is under way.
func pingFlood(t *testing.T, h *harness) net.Conn {
	t.Helper()
	r := openRaw(t, h)
	var frame bytes.Buffer
	_ = ws.WriteFrame(&frame, ws.MaskFrameInPlace(ws.NewPingFrame(bytes.Repeat([]byte("p"), 125))))
	burst := bytes.Repeat(frame.Bytes(), 512)
	started := make(chan struct{})
	go func() {
		defer close(started)
		for sent := 0; sent < 32<<20; {
			_ = r.conn.SetWriteDeadline(time.Now().Add(time.Second))
			n, err := r.conn.Write(burst)
			sent += n
			if sent > 4<<20 || err != nil {
				return // the gateway's pongs back up once a few MB are in
			}
		}
	}()
	<-started
	t.Cleanup(func() { r.conn.Close() })
	return r.conn
}

func TestUnauthenticatedFloodCannotHoldTheGateway(t *testing.T) {
	// The write timeout is far longer than the handshake budget (2s):
	// a flooding socket's pongs back up, and only the budget, not a
	// stalled write, may be what ends it here.
	mod := func(c *config.Config) {
		c.Gateway.MaxTunnels = 4
		c.Gateway.WriteTimeout = config.Duration(time.Minute)
	}
	t.Run("limits admin and budget", func(t *testing.T) {
		h := start(t, mod)
		url := admin(t, h)
		for range 4 {
			pingFlood(t, h)
		}
		// Handshaking sockets do not take authorized users' places.
		cfg := h.cfg("", "", tsgclient.Websocket)
		cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
		c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
		if err != nil {
			t.Fatalf("an authorized user was locked out by four unauthenticated sockets: %v", err)
		}
		echoRoundTrip(t, c, 100)
		// The admin can end a flooding socket at once.
		disconnected := false
		for _, tn := range tunnels(t, url) {
			if !tn.Open {
				if d := disconnect(t, url, tn.ID); d > time.Second {
					t.Fatalf("disconnect took %s", d)
				}
				disconnected = true
				break
			}
		}
		if !disconnected {
			t.Fatal("the admin API lists none of the flooding sockets' tunnels")
		}
		c.Close()
		// Nothing outlives the handshake budget (2s from accept), and the
		// budget is what ended them.
		waitGone(t, url, 4*time.Second, "flooding sockets")
		waitLogged(t, "no channel open within the handshake budget of 2s", 3, 2*time.Second, h)
	})
	t.Run("shutdown", func(t *testing.T) {
		h := start(t, mod)
		for range 4 {
			pingFlood(t, h)
		}
		h.cancel()
		waitStopped(t, h, 4*time.Second) // grace 1s, then closing never waits on a peer
	})
}

// sink is a host that accepts connections and never reads from them.
func sink(t *testing.T) uint16 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*net.TCPConn).SetReadBuffer(4096)
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// source is a host that writes to every connection until it is closed,
// pausing pause between writes.
func source(t *testing.T, pause time.Duration) uint16 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := bytes.Repeat([]byte("d"), 16<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
					time.Sleep(pause)
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// relayModes are the ways a tunnel is relayed: a websocket on the event
// loops or on goroutines, and the legacy pair (always on goroutines).
var relayModes = []struct {
	name, transport string
	loops           int
}{
	{"websocket-loops", tsgclient.Websocket, 2},
	{"websocket-goroutines", tsgclient.Websocket, 0},
	{"legacy", tsgclient.Legacy, 2},
}

func TestHostThatStopsReadingCannotPinATunnel(t *testing.T) {
	for _, m := range relayModes {
		t.Run(m.name, func(t *testing.T) {
			for _, end := range []string{"admin", "write timeout", "shutdown"} {
				t.Run(end, func(t *testing.T) {
					// Only the write timeout's own case has one short
					// enough to end the tunnel: the others must end it
					// themselves, and take what time they need to set up.
					wt := time.Minute
					if end == "write timeout" {
						wt = 2 * time.Second
					}
					h := start(t, func(c *config.Config) {
						c.Gateway.RelayLoops = &m.loops
						c.Gateway.WriteTimeout = config.Duration(wt)
					})
					url := admin(t, h)
					port := sink(t)
					cfg := h.cfg("", "", m.transport)
					cfg.Token = h.token(t, "bob", "127.0.0.1", port, time.Minute)
					c, err := dial(t, cfg, "127.0.0.1", port)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					go func() { _, _ = c.Write(make([]byte, 20<<20)) }()
					waitStalled(t, h, url, 20<<20) // the host's buffers fill
					if end != "write timeout" {
						c.Close() // and the client goes away
					}
					switch end {
					case "admin":
						list := tunnels(t, url)
						if len(list) != 1 {
							t.Fatalf("tunnels: %+v", list)
						}
						if d := disconnect(t, url, list[0].ID); d > time.Second {
							t.Fatalf("disconnect took %s", d)
						}
						waitGone(t, url, 2*time.Second, "after an admin disconnect")
					case "write timeout":
						waitGone(t, url, 6*time.Second, "with a host that takes nothing")
						if !strings.Contains(h.logs.String(), "host took no data") {
							t.Fatal("the tunnel's end was not logged with its reason")
						}
					case "shutdown":
						h.cancel()
						waitStopped(t, h, 4*time.Second)
					}
				})
			}
		})
	}
}

func TestClientThatStopsReadingIsTimedOut(t *testing.T) {
	for _, m := range relayModes {
		t.Run(m.name, func(t *testing.T) {
			h := start(t, func(c *config.Config) {
				c.Gateway.RelayLoops = &m.loops
				c.Gateway.WriteTimeout = config.Duration(2 * time.Second)
			})
			url := admin(t, h)
			port := source(t, 0)
			cfg := h.cfg("", "", m.transport)
			cfg.Token = h.token(t, "bob", "127.0.0.1", port, time.Minute)
			c, err := dial(t, cfg, "127.0.0.1", port)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close() // never read
			waitGone(t, url, 8*time.Second, "with a client that reads nothing")
			if !strings.Contains(h.logs.String(), "client took no data") {
				t.Fatal("the tunnel's end was not logged with its reason")
			}
		})
	}
}

// outHalf opens an unauthenticated (PAA, no token yet) legacy OUT half
// from the local address src, and reports whether the gateway took it.
func outHalf(t *testing.T, h *harness, src string, id int) (net.Conn, bool) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 3 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", h.addr, h.clientTLS)
	if err != nil {
		return nil, false // closed before TLS finished: refused
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(conn, "RDG_OUT_DATA /remoteDesktopGateway/ HTTP/1.1\r\nHost: gw\r\nRDG-Auth-Scheme: PAA\r\nRDG-Connection-Id: {%s-%d}\r\n\r\n", src, id)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return conn, false
	}
	return conn, resp.StatusCode == http.StatusOK
}

func TestUnauthenticatedConnectionsAreCapped(t *testing.T) {
	h := start(t, func(c *config.Config) {
		c.Gateway.MaxUnauthenticated = 24
		c.Gateway.MaxUnauthenticatedPerAddr = 16
		c.Gateway.HandshakeTimeout = config.Duration(6 * time.Second) // outlasts both rounds below, even under -race
	})
	var held []net.Conn // the halves the gateway took
	took := func(src string, n int) int {
		k := 0
		for i := range n {
			if conn, ok := outHalf(t, h, src, i); ok {
				held = append(held, conn)
				k++
			}
		}
		return k
	}
	if k := took("127.0.0.2", 100); k != 16 {
		t.Fatalf("one address got %d waiting OUT halves, want its cap of 16", k)
	}
	// Another address is not held back by the first one's cap...
	cfg := h.cfg("", "", tsgclient.Websocket)
	cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
	c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
	if err != nil {
		t.Fatalf("a client from another address was refused: %v", err)
	}
	echoRoundTrip(t, c, 100)
	c.Close()
	// ...but all of them share the global cap.
	if k := took("127.0.0.3", 100); k != 8 {
		t.Fatalf("a second address got %d waiting OUT halves, want the 8 left of the global cap of 24", k)
	}
	// The budget ends every waiting half (the gateway closes it), and
	// their places are free again.
	for _, conn := range held {
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, conn); isTimeout(err) {
			t.Fatal("a waiting OUT half was still open 10 s after its budget of 6 s began")
		}
	}
	if k := took("127.0.0.2", 4); k != 4 {
		t.Fatalf("after the budget, %d of 4 new halves were taken", k)
	}
}

// TestBudgetSpansKeptAliveRequests starts NTLM over and over on one
// kept-alive connection, each request well within the header timeout:
// the connection must still end when its handshake budget does.
func TestBudgetSpansKeptAliveRequests(t *testing.T) {
	h := start(t, nil) // handshake_timeout: 2s
	conn, err := tls.Dial("tcp", h.addr, h.clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	negotiate := base64.StdEncoding.EncodeToString([]byte("NTLMSSP\x00\x01\x00\x00\x00\x07\x82\x08\xa2" + strings.Repeat("\x00", 16)))
	start := time.Now()
	for time.Since(start) < 8*time.Second {
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		_, err := fmt.Fprintf(conn, "RDG_OUT_DATA /remoteDesktopGateway/ HTTP/1.1\r\nHost: gw\r\nRDG-Connection-Id: {k}\r\nAuthorization: NTLM %s\r\n\r\n", negotiate)
		if err == nil {
			var resp *http.Response
			if resp, err = http.ReadResponse(br, nil); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		if err != nil {
			// The budget (2s) ends it: not a request's own timeout, nor
			// the first answer.
			if d := time.Since(start); d > 3500*time.Millisecond || d < 1500*time.Millisecond {
				t.Fatalf("closed after %s, want the budget of 2s", d)
			}
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatal("a connection that never authenticated stayed open for 8s")
}

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
	t.Run("one tunnel", func(t *testing.T) {
		h := start(t, nil)
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
		h := start(t, func(c *config.Config) { three := 3; c.Gateway.TokenMaxUses = &three })
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
	// A tunnel whose host cannot be reached never used its token: the
	// client may try again (from any address, as the failed try bound it
	// to none), and only a tunnel that opened spends it.
	t.Run("host down", func(t *testing.T) {
		h := start(t, nil)
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
