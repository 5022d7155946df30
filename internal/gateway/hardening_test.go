package gateway_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
	"github.com/deskway/deskway/internal/tsgclient"
)

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
		// The admin can end a flooding socket at once: asked right away,
		// for the newest flood, well inside its 2 s budget (the oldest,
		// started before the other three, once reached its budget first
		// on a loaded machine: 404).
		disconnected := false
		list := tunnels(t, url)
		for i := len(list) - 1; i >= 0; i-- {
			if tn := list[i]; !tn.Open {
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
		pingFlood(t, h) // four again
		// Handshaking sockets do not take authorized users' places.
		cfg := h.cfg("", "", tsgclient.Websocket)
		cfg.Token = h.token(t, "bob", "127.0.0.1", h.echoPort, time.Minute)
		c, err := dial(t, cfg, "127.0.0.1", h.echoPort)
		if err != nil {
			t.Fatalf("an authorized user was locked out by four unauthenticated sockets: %v", err)
		}
		echoRoundTrip(t, c, 100)
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
