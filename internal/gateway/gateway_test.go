package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tsgclient"
)

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

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset")
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
