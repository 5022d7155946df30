package gateway_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/rdcleanpath"
	"github.com/deskway/deskway/internal/proto/x224"
	"github.com/deskway/deskway/internal/proto/x224/x224test"
	"github.com/deskway/deskway/internal/testkit"
)

const portalOrigin = "https://portal.test"

// fakeHost is an RDP host as far as a gateway sees it before RDP proper:
// it answers the X.224 Connection Request with a Connection Confirm
// selecting protocol, does TLS with cert, then echoes what it reads.
type fakeHost struct {
	port     uint16
	accepted atomic.Int32
	got      chan []byte // what the host read after TLS, first read
}

func startFakeHost(t *testing.T, cert tls.Certificate, protocol uint32) *fakeHost {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	h := &fakeHost{port: uint16(ln.Addr().(*net.TCPAddr).Port), got: make(chan []byte, 4)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			go h.serve(c, cert, protocol)
		}
	}()
	return h
}

func (h *fakeHost) serve(c net.Conn, cert tls.Certificate, protocol uint32) {
	defer c.Close()
	hdr := make([]byte, 4)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return
	}
	rest := make([]byte, int(binary.BigEndian.Uint16(hdr[2:]))-4)
	if _, err := io.ReadFull(c, rest); err != nil {
		return
	}
	cc := []byte{3, 0, 0, 19, 14, 0xd0, 0, 0, 0x12, 0x34, 0, 2, 0, 8, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(cc[15:], protocol)
	if _, err := c.Write(cc); err != nil || protocol == x224.ProtocolRDP {
		return
	}
	tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
	buf := make([]byte, 64<<10)
	for first := true; ; first = false {
		n, err := tc.Read(buf)
		if n > 0 {
			if first {
				h.got <- bytes.Clone(buf[:n])
			}
			if _, err := tc.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// browserHarness is a gateway with browser sessions on, for the portal's
// origin, and a resource policy that pins the fake host's certificate.
func browserHarness(t *testing.T, protocol uint32, mods ...func(*config.Config)) (*harness, *fakeHost, []byte) {
	t.Helper()
	hostTLS, _, _, _ := testkit.TLS(t)
	cert := hostTLS.Certificates[0]
	sum := sha256.Sum256(cert.Certificate[0])
	h := start(t, func(c *config.Config) {
		c.Gateway.BrowserOrigins = []string{portalOrigin}
		c.Gateway.RAP[0].HostCertSHA256 = []string{hex.EncodeToString(sum[:])}
		for _, m := range mods {
			m(c)
		}
	})
	return h, startFakeHost(t, cert, protocol), cert.Certificate[0]
}

// browserConn is a browser's websocket to /rdp.
type browserConn struct {
	conn net.Conn
	br   *bufio.Reader
}

func openBrowser(t *testing.T, h *harness, origin string) *browserConn {
	t.Helper()
	return openBrowserAt(t, h, origin, "/rdp")
}

// openBrowserAt opens the websocket at path, which may carry a query.
func openBrowserAt(t *testing.T, h *harness, origin, path string) *browserConn {
	t.Helper()
	conn, err := tls.Dial("tcp", h.addr, h.clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "GET " + path + " HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: " + origin + "\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	return &browserConn{conn: conn, br: br}
}

func (b *browserConn) send(t *testing.T, p []byte) {
	t.Helper()
	if err := ws.WriteFrame(b.conn, ws.MaskFrameInPlace(ws.NewBinaryFrame(bytes.Clone(p)))); err != nil {
		t.Fatal(err)
	}
}

// next returns the next binary message, or an error at a close frame
// (with its reason) or the end of the connection.
func (b *browserConn) next() ([]byte, error) {
	_ = b.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := ws.ReadFrame(b.br)
		if err != nil {
			return nil, err
		}
		switch f.Header.OpCode {
		case ws.OpBinary:
			return f.Payload, nil
		case ws.OpClose:
			reason := ""
			if len(f.Payload) > 2 {
				reason = string(f.Payload[2:])
			}
			return nil, fmt.Errorf("closed: %q", reason)
		}
	}
}

// connectionRequest is what IronRDP's web client sends without CredSSP.
var connectionRequest = []byte{3, 0, 0, 19, 14, 0xe0, 0, 0, 0, 0, 0, 1, 0, 8, 0, 1, 0, 0, 0}

func request(token, destination string) []byte {
	b, err := (&rdcleanpath.PDU{Version: rdcleanpath.Version, Destination: destination, ProxyAuth: token, X224: connectionRequest}).Append(nil)
	if err != nil {
		panic(err)
	}
	return b
}

// clientInfo is a Client Info PDU with the given TS_INFO_PACKET flags.
func clientInfo(flags uint32) []byte {
	info := binary.LittleEndian.AppendUint32([]byte{0x40, 0, 0, 0, 0x09, 0x04, 0, 0}, flags)
	body := append([]byte{0x02, 0xf0, 0x80, 0x64, 0x00, 0x06, 0x03, 0xeb, 0x70, byte(len(info))}, info...)
	return append([]byte{3, 0, 0, byte(len(body) + 4)}, body...)
}

// TestBrowserSession: a browser's RDCleanPath request with a token opens
// a session: the answer carries the host's Connection Confirm and
// certificate, the browser's plain RDP reaches the host inside TLS with
// auto-logon turned on in its Client Info PDU, and the session is listed
// as a browser tunnel.
func TestBrowserSession(t *testing.T) {
	h, host, der := browserHarness(t, x224.ProtocolSSL)
	dest := fmt.Sprintf("127.0.0.1:%d", host.port)
	b := openBrowser(t, h, portalOrigin)
	b.send(t, request(h.token(t, "alice", "127.0.0.1", host.port, time.Minute), dest))
	msg, err := b.next()
	if err != nil {
		t.Fatalf("no answer: %v\n%s", err, h.logs.String())
	}
	resp, err := rdcleanpath.Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Error != nil {
		t.Fatalf("refused: %v\n%s", resp.Error, h.logs.String())
	}
	if resp.X224[5] != 0xd0 || len(resp.ServerCertChain) != 1 || !bytes.Equal(resp.ServerCertChain[0], der) || resp.ServerAddr != dest {
		t.Fatalf("answer %+v", resp)
	}
	b.send(t, clientInfo(0x133))
	select {
	case got := <-host.got:
		if want := clientInfo(0x13b); !bytes.Equal(got, want) {
			t.Fatalf("the host got %x, want %x (auto-logon on)", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the host got nothing")
	}
	if echo, err := b.next(); err != nil || !bytes.Equal(echo, clientInfo(0x13b)) {
		t.Fatalf("echo %x, %v", echo, err)
	}
	// A bitmap update from the host reaches the browser with its
	// destination as wide as its bitmap (494 px of a 496-px bitmap: xrdp's
	// padding, which the web client would draw sheared).
	padded, _ := hex.DecodeString("0300003a02f080680001" + "03eb70802b2b0017" + "00ea03ea03010000011d000200000001000100280" +
		"0a4011502b301f00110001000010403" + "00aabbcc")
	widened, _ := hex.DecodeString("0300003a02f080680001" + "03eb70802b2b0017" + "00ea03ea03010000011d000200000001000100280" +
		"0a4011702b301f00110001000010403" + "00aabbcc")
	b.send(t, padded)
	if echo, err := b.next(); err != nil || !bytes.Equal(echo, widened) {
		t.Fatalf("the host's bitmap update reached the browser as %x, %v; want %x", echo, err, widened)
	}
	// After the Client Info PDU bytes pass untouched.
	tail := append([]byte{0x44, 0x0a}, bytes.Repeat([]byte{0xaa}, 3000)...)
	b.send(t, tail)
	var back []byte
	for len(back) < len(tail) {
		m, err := b.next()
		if err != nil {
			t.Fatal(err)
		}
		back = append(back, m...)
	}
	if !bytes.Equal(back, tail) {
		t.Fatal("bytes after the connection sequence changed on the way")
	}
	found := false
	for _, ti := range h.srv.Tunnels() {
		if ti.Transport == "browser" && ti.User == "alice" && ti.Open && ti.Target == dest && ti.BytesUp > 3000 {
			found = true
		}
	}
	if !found {
		t.Fatalf("the session is not listed: %+v", h.srv.Tunnels())
	}
}

// TestBrowserRefusals: every refusal is an RDCleanPath error with the
// HTTP status the page explains, and refusals on who the client is come
// before the gateway touches the host.
func TestBrowserRefusals(t *testing.T) {
	h, host, _ := browserHarness(t, x224.ProtocolSSL)
	dest := fmt.Sprintf("127.0.0.1:%d", host.port)
	other := startFakeHost(t, func() tls.Certificate { c, _, _, _ := testkit.TLS(t); return c.Certificates[0] }(), x224.ProtocolSSL)
	noTLS, _, _ := func() (*fakeHost, int, int) {
		c, _, _, _ := testkit.TLS(t)
		return startFakeHost(t, c.Certificates[0], x224.ProtocolRDP), 0, 0
	}()
	tok := func(user, hostName string, port uint16, ttl time.Duration) string {
		return h.token(t, user, hostName, port, ttl)
	}
	for _, c := range []struct {
		name, origin string
		req          []byte
		status       uint16
		log          string
		dials        bool // whether the gateway may have reached a host
	}{
		{"foreign origin", "https://evil.test", request(tok("alice", "127.0.0.1", host.port, time.Minute), dest), 403, `origin \"https://evil.test\" may not`, false},
		{"no origin", "", request(tok("alice", "127.0.0.1", host.port, time.Minute), dest), 403, "may not open browser sessions", false},
		{"no token", portalOrigin, request("", dest), 401, "", false},
		{"forged token", portalOrigin, request(tok("alice", "127.0.0.1", host.port, time.Minute)+"x", dest), 401, "", false},
		{"expired token", portalOrigin, request(tok("alice", "127.0.0.1", host.port, -time.Minute), dest), 401, "expired", false},
		{"token for another host", portalOrigin, request(tok("alice", "127.0.0.2", host.port, time.Minute), dest), 403, "token allows 127.0.0.2", false},
		{"host outside the resource policies", portalOrigin, request(tok("alice", "10.9.9.9", 3389, time.Minute), "10.9.9.9:3389"), 403, "no resource policy", false},
		{"user outside the connection policies", portalOrigin, request(tok("eve", "127.0.0.1", host.port, time.Minute), dest), 403, "", false},
		{"host certificate not pinned", portalOrigin, request(tok("alice", "127.0.0.1", other.port, time.Minute), fmt.Sprintf("127.0.0.1:%d", other.port)), 502, "not among those resource policy loop pins", true},
		{"host without TLS", portalOrigin, request(tok("alice", "127.0.0.1", noTLS.port, time.Minute), fmt.Sprintf("127.0.0.1:%d", noTLS.port)), 502, "offers no TLS", true},
		{"not RDCleanPath", portalOrigin, []byte("\x16\x03\x01 hello"), 400, "not a DER SEQUENCE", false},
		{"request too large", portalOrigin, []byte{0x30, 0x83, 0x10, 0x00, 0x00}, 400, "over the limit", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := host.accepted.Load()
			mark := len(h.logs.String())
			b := openBrowser(t, h, c.origin)
			// The origin is refused before the request is read: the
			// gateway may have closed before the request is written.
			_ = ws.WriteFrame(b.conn, ws.MaskFrameInPlace(ws.NewBinaryFrame(bytes.Clone(c.req))))
			msg, err := b.next()
			if err != nil {
				t.Fatalf("no error PDU: %v", err)
			}
			p, err := rdcleanpath.Decode(msg)
			if err != nil || p.Error == nil || p.Error.HTTPStatus == nil {
				t.Fatalf("answer %+v, %v", p, err)
			}
			if got := *p.Error.HTTPStatus; got != c.status {
				t.Errorf("HTTP status %d, want %d\n%s", got, c.status, h.logs.String()[mark:])
			}
			if _, err := b.next(); err == nil {
				t.Error("the connection stayed open after the refusal")
			}
			if c.log != "" && !strings.Contains(h.logs.String()[mark:], c.log) {
				t.Errorf("the log does not say %q:\n%s", c.log, h.logs.String()[mark:])
			}
			if !c.dials && host.accepted.Load() != before {
				t.Error("the gateway connected to the host for a refused client")
			}
		})
	}
}

// TestBrowserSilentClientIsTimedOut: a websocket that never sends its
// request is closed at the end of the handshake budget (2 s here).
func TestBrowserSilentClientIsTimedOut(t *testing.T) {
	h, _, _ := browserHarness(t, x224.ProtocolSSL)
	b := openBrowser(t, h, portalOrigin)
	start := time.Now()
	_, err := b.next()
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("still open after %s: %v", time.Since(start), err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %s, the budget is 2s", d)
	}
}

// TestBrowserSessionsOffByDefault: without browser_origins /rdp is not
// there at all.
func TestBrowserSessionsOffByDefault(t *testing.T) {
	h := start(t, nil)
	conn, err := tls.Dial("tcp", h.addr, h.clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "GET /rdp HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: " + portalOrigin + "\r\n\r\n"
	_, _ = io.WriteString(conn, req)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "gateway.browser_origins") {
		t.Fatalf("%s %q", resp.Status, body)
	}
}

// connectInitialWith is a client's MCS Connect Initial with clientName in
// its core data and the given static channels in its network data.
func connectInitialWith(clientName []byte, channels ...string) []byte {
	return x224test.ConnectInitial(raisedBuild, clientName, channels...)
}

// raisedBuild is the client build the gateway gives a browser client
// that reports an older one.
const raisedBuild = 2600

// connectInitialBuild is connectInitialWith with build as the core
// data's client build.
func connectInitialBuild(build uint32, clientName []byte, channels ...string) []byte {
	return x224test.ConnectInitial(build, clientName, channels...)
}

func connectInitial(channels ...string) []byte { return connectInitialWith(nil, channels...) }

// withholdingSession opens a browser session on a gateway whose policy
// allows the given redirection, to a host selecting protocol.
func withholdingSession(t *testing.T, redirection []string, protocol uint32, mod func(*config.Config)) (*harness, *fakeHost, *browserConn) {
	t.Helper()
	return sessionAt(t, "/rdp", redirection, protocol, mod)
}

// sessionAt is withholdingSession with the websocket opened at path.
func sessionAt(t *testing.T, path string, redirection []string, protocol uint32, mod func(*config.Config)) (*harness, *fakeHost, *browserConn) {
	t.Helper()
	hostTLS, _, _, _ := testkit.TLS(t)
	cert := hostTLS.Certificates[0]
	sum := sha256.Sum256(cert.Certificate[0])
	h := start(t, func(cfg *config.Config) {
		cfg.Gateway.BrowserOrigins = []string{portalOrigin}
		cfg.Gateway.RAP[0].HostCertSHA256 = []string{hex.EncodeToString(sum[:])}
		cfg.Gateway.CAP[0].Redirection = redirection
		if mod != nil {
			mod(cfg)
		}
	})
	host := startFakeHost(t, cert, protocol)
	b := openBrowserAt(t, h, portalOrigin, path)
	cr := bytes.Clone(connectionRequest)
	cr[15] = byte(x224.ProtocolSSL | x224.ProtocolHybrid)
	req, err := (&rdcleanpath.PDU{Version: rdcleanpath.Version, Destination: fmt.Sprintf("127.0.0.1:%d", host.port),
		ProxyAuth: h.token(t, "alice", "127.0.0.1", host.port, time.Minute), X224: cr}).Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	b.send(t, req)
	if msg, err := b.next(); err != nil {
		t.Fatal(err)
	} else if p, _ := rdcleanpath.Decode(msg); p == nil || p.Error != nil {
		t.Fatalf("refused: %+v", p)
	}
	return h, host, b
}

// TestBrowserClipboardWithheldByPolicy: a connection policy that allows
// no clipboard makes the gateway rename the browser's clipboard channel
// in its Connect Initial, so the host opens no clipboard; one that allows
// it leaves the channel alone.
func TestBrowserClipboardWithheldByPolicy(t *testing.T) {
	for _, c := range []struct {
		redirection []string
		want        []byte
	}{
		{[]string{"drives"}, connectInitial("rdpdr", "_liprdr", "drdynvc")},
		{[]string{"none"}, connectInitial("_dpdr", "_liprdr", "drdynvc")},
		{nil, connectInitial("rdpdr", "cliprdr", "drdynvc")},
	} {
		t.Run(fmt.Sprint(c.redirection), func(t *testing.T) {
			_, host, b := withholdingSession(t, c.redirection, x224.ProtocolSSL, nil)
			b.send(t, connectInitial("rdpdr", "cliprdr", "drdynvc"))
			select {
			case got := <-host.got:
				if !bytes.Equal(got, c.want) {
					t.Fatalf("the host got\n%x\nwant\n%x", got, c.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the host got nothing")
			}
		})
	}
}

// TestBrowserClientBuildRaised: the browser's client reports client
// build 0, for which xrdp never resizes a session; the host gets the
// gateway's raisedBuild, and a newer build as it was.
func TestBrowserClientBuildRaised(t *testing.T) {
	for _, c := range []struct{ sent, want uint32 }{{0, raisedBuild}, {19041, 19041}} {
		_, host, b := withholdingSession(t, nil, x224.ProtocolSSL, nil)
		b.send(t, connectInitialBuild(c.sent, nil, "cliprdr"))
		if got, want := recv(t, host), connectInitialBuild(c.want, nil, "cliprdr"); !bytes.Equal(got, want) {
			t.Fatalf("sent build %d: the host got\n%x\nwant\n%x", c.sent, got, want)
		}
	}
}

// TestBrowserWithholdingCannotBeDodged: the ways found around the
// clipboard policy each fail: a decoy network-data header in the client
// name, the channel list sent after CredSSP when the host chose NLA, and
// a packet of another kind sent first to end the gateway's watch.
func TestBrowserWithholdingCannotBeDodged(t *testing.T) {
	decoy := []byte{0x03, 0xc0, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00}
	t.Run("decoy", func(t *testing.T) {
		_, host, b := withholdingSession(t, []string{"drives"}, x224.ProtocolSSL, nil)
		b.send(t, connectInitialWith(decoy, "rdpdr", "cliprdr"))
		if got := recv(t, host); !bytes.Equal(got, connectInitialWith(decoy, "rdpdr", "_liprdr")) {
			t.Fatalf("the host got the clipboard channel: %x", got)
		}
	})
	t.Run("after CredSSP", func(t *testing.T) {
		_, host, b := withholdingSession(t, []string{"drives"}, x224.ProtocolHybrid, nil)
		tsRequest := []byte{0x30, 0x05, 0xa0, 0x03, 0x02, 0x01, 0x06}
		b.send(t, append(tsRequest, connectInitial("cliprdr")...))
		if got := recv(t, host); !bytes.Equal(got, append(tsRequest, connectInitial("_liprdr")...)) {
			t.Fatalf("the host got %x", got)
		}
	})
	t.Run("something else first", func(t *testing.T) {
		h, host, b := withholdingSession(t, []string{"drives"}, x224.ProtocolSSL, nil)
		mark := len(h.logs.String())
		b.send(t, []byte{0x44, 0x05, 0x00, 0x00, 0x00})
		// The gateway may already have closed on the first packet, and
		// then this write fails: what matters is that nothing reaches
		// the host.
		_ = ws.WriteFrame(b.conn, ws.MaskFrameInPlace(ws.NewBinaryFrame(connectInitial("cliprdr"))))
		if _, err := b.next(); err == nil {
			t.Fatal("the session went on")
		}
		select {
		case got := <-host.got:
			t.Fatalf("the host got %x", got)
		default:
		}
		// The tunnel logs its end after the socket closes: wait for it.
		for deadline := time.Now().Add(5 * time.Second); !strings.Contains(h.logs.String()[mark:], "before the MCS Connect Initial"); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the log does not say why:\n%s", h.logs.String()[mark:])
			}
		}
	})
}

// recv is what the host read first after TLS, or a failure after 5 s.
func recv(t *testing.T, host *fakeHost) []byte {
	t.Helper()
	select {
	case got := <-host.got:
		return got
	case <-time.After(5 * time.Second):
		t.Fatal("the host got nothing")
	}
	return nil
}

// TestBrowserThrottledAndMethods: an address locked out by failed logins
// is refused on /rdp as on RDG_OUT_DATA (429), and /rdp is off when the
// gateway offers no PAA.
func TestBrowserThrottledAndMethods(t *testing.T) {
	h, host, _ := browserHarness(t, x224.ProtocolSSL)
	dest := fmt.Sprintf("127.0.0.1:%d", host.port)
	var last uint16
	for i := 0; i < 25 && last != http.StatusTooManyRequests; i++ {
		b := openBrowser(t, h, portalOrigin)
		b.send(t, request("forged."+fmt.Sprint(i), dest))
		msg, err := b.next()
		if err != nil {
			t.Fatal(err)
		}
		p, _ := rdcleanpath.Decode(msg)
		if p == nil || p.Error == nil || p.Error.HTTPStatus == nil {
			t.Fatalf("answer %+v", p)
		}
		last = *p.Error.HTTPStatus
	}
	if last != http.StatusTooManyRequests {
		t.Fatalf("25 forged tokens, last answer %d: the throttle never held the address back", last)
	}
	hostTLS, _, _, _ := testkit.TLS(t)
	sum := sha256.Sum256(hostTLS.Certificates[0].Certificate[0])
	ntlmOnly := start(t, func(c *config.Config) {
		c.Gateway.BrowserOrigins = []string{portalOrigin}
		c.Gateway.RAP[0].HostCertSHA256 = []string{hex.EncodeToString(sum[:])}
		c.Gateway.AuthMethods = []string{"ntlm"}
	})
	conn, err := tls.Dial("tcp", ntlmOnly.addr, ntlmOnly.clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /rdp HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: "+portalOrigin+"\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/rdp on a gateway without PAA: %s", resp.Status)
	}
}

// TestBrowserSilentHostIsTimedOut: a host that accepts the connection but
// never sends its Connection Confirm cannot hold the session: the browser
// is told 502 when the handshake budget (2 s here) ends.
func TestBrowserSilentHostIsTimedOut(t *testing.T) {
	h, _, _ := browserHarness(t, x224.ProtocolSSL)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c // accepted, never answered
		}
	}()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	b := openBrowser(t, h, portalOrigin)
	start := time.Now()
	b.send(t, request(h.token(t, "alice", "127.0.0.1", port, time.Minute), fmt.Sprintf("127.0.0.1:%d", port)))
	msg, err := b.next()
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	p, err := rdcleanpath.Decode(msg)
	if err != nil || p.Error == nil || p.Error.HTTPStatus == nil || *p.Error.HTTPStatus != http.StatusBadGateway {
		t.Fatalf("answer %+v, %v; want 502", p, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("answered after %s; the budget is 2 s", d)
	}
	select {
	case c := <-held:
		c.Close()
	default:
	}
}
