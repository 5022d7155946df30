package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proto/tsgu"
)

// bytesTransport feeds a fixed byte stream to a tunnel and collects what it sends.
type bytesTransport struct {
	pr  packetReader
	mu  sync.Mutex
	out bytes.Buffer
}

func (b *bytesTransport) readPacket() ([]byte, error) { return b.pr.next() }
func (b *bytesTransport) writePacket(p []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.out.Write(p)
	return nil
}
func (b *bytesTransport) writeData(frame []byte, n int) error {
	start := headroom - tsgu.DataHeaderLen
	tsgu.PutDataHeader(frame[start:], n)
	return b.writePacket(frame[start : headroom+n])
}
func (b *bytesTransport) setReadDeadline(time.Time) error { return nil }
func (b *bytesTransport) close(...[]byte)                 {}

const fuzzKey = "0123456789abcdef0123456789abcdef"

// fuzzServer is a gateway whose dials report their address on dialed.
func fuzzServer(t testing.TB, dialed func(addr string)) *Server {
	cfg, err := config.Parse([]byte(`
auth: {token_key: "` + fuzzKey + `"}
gateway:
  token_max_uses: 0 # every input reuses the seed's token
  connection_policies: [{name: all, users: ["*"]}]
  resource_policies: [{name: loop, users: ["*"], hosts: [127.0.0.1]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	users, _ := auth.NewUsers(nil)
	tokens, _ := auth.NewTokens([]byte(fuzzKey), nil)
	pol, _ := policy.New(cfg.Gateway, nil)
	s, err := New(cfg.Gateway, Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Users: users, Tokens: tokens, Policy: pol,
		Throttle: auth.NewThrottle(5, 20, time.Minute, nil),
		// The "host" hangs up at once, so an opened channel ends quickly.
		Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
			dialed(addr)
			a, b := net.Pipe()
			b.Close()
			return a, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func seedStream(t testing.TB) []byte { return seedStreamKey(t, fuzzKey) }

// seedStreamKey is a whole PAA tunnel, channel and data, whose token is
// signed with key.
func seedStreamKey(t testing.TB, key string) []byte {
	tokens, _ := auth.NewTokens([]byte(key), nil)
	tok, _ := tokens.Mint("u", nil, "127.0.0.1", 3389, time.Hour)
	tc := &tsgu.TunnelCreate{Capabilities: tsgu.CapMessagingServiceMsg}
	tc.SetCookieString(tok)
	var b []byte
	for _, m := range []tsgu.Message{
		&tsgu.HandshakeRequest{VerMajor: 1, ExtendedAuth: tsgu.ExtAuthPAA}, tc, &tsgu.TunnelAuth{ClientName: "c"},
		&tsgu.ChannelCreate{Resources: []string{"127.0.0.1"}, Port: 3389, Protocol: 3},
		&tsgu.Data{Payload: []byte("hello")}, &tsgu.Keepalive{}, &tsgu.CloseChannel{},
	} {
		var err error
		if b, err = m.Append(b); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// tokenTargets lists the host:port of every valid token the input's
// TUNNEL_CREATE packets carry, read apart from the server's own parsing.
func tokenTargets(in []byte) map[string]bool {
	tokens, _ := auth.NewTokens([]byte(fuzzKey), nil)
	out := map[string]bool{}
	for len(in) > 0 {
		p, n, err := tsgu.Split(in)
		if err != nil || n == 0 {
			break
		}
		in = in[n:]
		if m, err := tsgu.Decode(p); err == nil {
			if tc, ok := m.(*tsgu.TunnelCreate); ok {
				if c, err := tokens.Verify(tc.CookieString()); err == nil {
					out[net.JoinHostPort(c.Host, fmt.Sprint(c.Port))] = true
				}
			}
		}
	}
	return out
}

// FuzzTunnel runs the whole server-side state machine on arbitrary client
// bytes: it must end, never panic, only ever send well-formed packets,
// and dial a host only when the input carried a valid token for it.
func FuzzTunnel(f *testing.F) {
	f.Add(seedStream(f))
	f.Add(seedStreamKey(f, "another key, 32 bytes or longer.."))
	f.Add([]byte{})
	var dials []string
	s := fuzzServer(f, func(addr string) { dials = append(dials, addr) })
	f.Fuzz(func(t *testing.T, in []byte) {
		dials = nil
		bt := &bytesTransport{pr: packetReader{r: bytes.NewReader(in)}}
		done := make(chan struct{})
		go func() {
			s.runTunnel(bt, handshakeInfo{method: policy.MethodPAA, remote: netip.MustParseAddr("127.0.0.1")}, "fuzz")
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("tunnel did not end on a finite input")
		}
		out := bt.out.Bytes()
		for len(out) > 0 {
			p, n, err := tsgu.Split(out)
			if err != nil || n == 0 {
				t.Fatalf("server sent a malformed stream: %x (%v)", out, err)
			}
			if _, err := tsgu.Decode(p); err != nil {
				t.Fatalf("server sent an undecodable packet: %v", err)
			}
			out = out[n:]
		}
		if len(dials) > 0 {
			allowed := tokenTargets(in)
			for _, d := range dials {
				if !allowed[d] {
					t.Fatalf("the gateway dialed %s without a valid token for it (tokens for %v)", d, allowed)
				}
			}
		}
	})
}

func TestSeedStreamOpensChannel(t *testing.T) {
	dialed := 0
	s := fuzzServer(t, func(string) { dialed++ })
	bt := &bytesTransport{pr: packetReader{r: bytes.NewReader(seedStream(t))}}
	s.runTunnel(bt, handshakeInfo{method: policy.MethodPAA, remote: netip.MustParseAddr("127.0.0.1")}, "test")
	var types []tsgu.PacketType
	for out := bt.out.Bytes(); len(out) > 0; {
		p, n, _ := tsgu.Split(out)
		m, err := tsgu.Decode(p)
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, m.Type())
		out = out[n:]
	}
	want := []tsgu.PacketType{tsgu.TypeHandshakeResponse, tsgu.TypeTunnelResponse, tsgu.TypeTunnelAuthResponse, tsgu.TypeChannelResponse}
	if len(types) < len(want) {
		t.Fatalf("server sent %v", types)
	}
	for i, w := range want {
		if types[i] != w {
			t.Fatalf("packet %d is %s, want %s (all: %v)", i, types[i], w, types)
		}
	}
	if dialed != 1 || len(tokenTargets(seedStream(t))) != 1 {
		t.Fatalf("the seed's channel dialed %d times, want 1", dialed)
	}
	// The same tunnel with a token signed by another key dials nothing.
	dialed = 0
	forged := seedStreamKey(t, "another key, 32 bytes or longer..")
	s.runTunnel(&bytesTransport{pr: packetReader{r: bytes.NewReader(forged)}},
		handshakeInfo{method: policy.MethodPAA, remote: netip.MustParseAddr("127.0.0.1")}, "test")
	if dialed != 0 || len(tokenTargets(forged)) != 0 {
		t.Fatalf("a forged token dialed %d times", dialed)
	}
}
