package faults

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/loopback"
	"github.com/deskway/deskway/internal/tlsconf"
	"github.com/deskway/deskway/internal/tsgclient"
)

// echoRig is a real `deskway gateway` in front of a session host that
// echoes every byte (standing in for an RDP host: the gateway relays
// bytes and does not read RDP), optionally through a fault proxy that can
// cut the link between them.
type echoRig struct {
	dir, tokenKey string
	gw            *childproc.Proc
	echo          net.Listener
	gwAddr        string
	// hostPort is the port tunnels ask for: the proxy's, or the echo
	// server's when there is no proxy.
	hostPort uint16
	proxy    *faultProxy
	// signer mints tokens as a broker with a correct clock does.
	signer *auth.Tokens
}

const echoGatewayYAML = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[7]d", tokens: [faults-bench-admin]}
tls: {cert: %[2]s, key: %[3]s}
auth:
  token_key: %[4]s
gateway:
  listen: "127.0.0.1:%[5]d"
  auth_methods: [paa]
  write_timeout: %[6]s
  connection_policies: [{name: bench, users: ["*"]}]
  resource_policies: [{name: echo, users: ["*"], hosts: [127.0.0.1]}]
`

// startEchoRig starts the echo host and a gateway whose token clock is
// clockOffset off, with a fault proxy between them when cuttable; extra
// are more flags of deskway gateway.
func startEchoRig(env Env, clockOffset, writeTimeout time.Duration, cuttable bool, extra ...string) (*echoRig, error) {
	return startEchoRigKey(env, "faults-bench-token-key-0123456789abcdef", clockOffset, writeTimeout, cuttable, extra...)
}

// startEchoRigKey is startEchoRig with the token key the gateway checks
// tokens with: a broker's, when a real broker signs them.
func startEchoRigKey(env Env, tokenKey string, clockOffset, writeTimeout time.Duration, cuttable bool, extra ...string) (*echoRig, error) {
	r := &echoRig{dir: env.Work, tokenKey: tokenKey}
	cert, key := filepath.Join(r.dir, "tls.crt"), filepath.Join(r.dir, "tls.key")
	if err := tlsconf.SelfSigned(cert, key, nil); err != nil {
		return nil, err
	}
	var err error
	if r.signer, err = auth.NewTokens([]byte(r.tokenKey), nil); err != nil {
		return nil, err
	}
	if r.echo, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("faults: echo host: %w", err)
	}
	go serveEcho(r.echo)
	r.hostPort = uint16(r.echo.Addr().(*net.TCPAddr).Port)
	// The admin listener too: its default port may be another's.
	ports, err := loopback.FreePorts(2)
	if err != nil {
		r.close()
		return nil, err
	}
	gwPort := ports[0]
	if cuttable {
		if r.proxy, err = newFaultProxy(r.echo.Addr().String()); err != nil {
			r.close()
			return nil, err
		}
		r.hostPort = uint16(r.proxy.Port())
	}
	cfg := filepath.Join(r.dir, "gateway.yaml")
	body := fmt.Sprintf(echoGatewayYAML, filepath.Join(r.dir, "gw-state"), cert, key, r.tokenKey, gwPort, writeTimeout, ports[1])
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		r.close()
		return nil, fmt.Errorf("faults: %w", err)
	}
	r.gwAddr = fmt.Sprintf("127.0.0.1:%d", gwPort)
	args := append([]string{"gateway", "-c", cfg, "--clock-offset", clockOffset.String()}, extra...)
	if r.gw, err = childproc.Start(nil, env.Bin, args...); err != nil {
		r.close()
		return nil, err
	}
	if err := loopback.WaitPort(r.gwAddr, 15*time.Second); err != nil {
		r.close()
		return nil, fmt.Errorf("faults: gateway: %w: %s", err, r.gw.Tail(5))
	}
	return r, nil
}

// dial opens a tunnel to the host with a fresh token of ttl, as the
// broker's launch answer gives one.
func (r *echoRig) dial(ctx context.Context, user string, ttl time.Duration) (*tsgclient.Conn, error) {
	tok, err := r.signer.Mint(user, nil, "127.0.0.1", int(r.hostPort), ttl)
	if err != nil {
		return nil, err
	}
	return r.dialToken(ctx, tok)
}

// dialToken opens a tunnel to the host with tok, a token a broker's
// launch answer carried.
func (r *echoRig) dialToken(ctx context.Context, tok string) (*tsgclient.Conn, error) {
	cfg := tsgclient.Config{Gateway: r.gwAddr, TLS: &tls.Config{InsecureSkipVerify: true}, Token: tok, Transport: tsgclient.Websocket}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return tsgclient.Dial(dctx, cfg, "127.0.0.1", r.hostPort)
}

func (r *echoRig) close() {
	r.gw.Stop()
	if r.proxy != nil {
		r.proxy.close()
	}
	r.echo.Close()
}

// serveEcho sends every byte back on the connection it came on, until
// the listener closes.
func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// patternByte is byte pos of every echo stream: a stream with a byte
// lost, doubled or reordered reads wrong from there on.
func patternByte(pos int64) byte { return byte(pos*7 + pos>>9) }

// echoStream sends the pattern through a tunnel and checks what comes
// back.
type echoStream struct {
	c         *tsgclient.Conn
	sent, got atomic.Int64
	wrong     atomic.Int64
	lastRecv  atomic.Int64 // unix nanoseconds of the latest echo
	mu        sync.Mutex
	endErr    error
	endedAt   time.Time
	ended     chan struct{}
}

func newEchoStream(c *tsgclient.Conn) *echoStream {
	s := &echoStream{c: c, ended: make(chan struct{})}
	s.lastRecv.Store(time.Now().UnixNano())
	go s.read()
	return s
}

func (s *echoStream) read() {
	buf := make([]byte, 64<<10)
	for {
		n, err := s.c.Read(buf)
		if n > 0 {
			pos := s.got.Load()
			for i := 0; i < n; i++ {
				if buf[i] != patternByte(pos+int64(i)) {
					s.wrong.Add(1)
				}
			}
			s.got.Add(int64(n))
			s.lastRecv.Store(time.Now().UnixNano())
		}
		if err != nil {
			s.mu.Lock()
			s.endErr, s.endedAt = err, time.Now()
			if errors.Is(err, io.EOF) && s.c.CloseStatus != 0 {
				s.endErr = fmt.Errorf("the gateway closed the channel with %s", s.c.CloseStatus)
			}
			s.mu.Unlock()
			close(s.ended)
			return
		}
	}
}

// write sends chunk bytes every pause (no pause: as fast as the tunnel
// takes them) until ctx ends or the tunnel does.
func (s *echoStream) write(ctx context.Context, chunk int, pause time.Duration) {
	buf := make([]byte, chunk)
	for ctx.Err() == nil {
		pos := s.sent.Load()
		for i := range buf {
			buf[i] = patternByte(pos + int64(i))
		}
		if _, err := s.c.Write(buf); err != nil {
			return
		}
		s.sent.Add(int64(chunk))
		if pause > 0 {
			select {
			case <-ctx.Done():
			case <-s.ended:
				return
			case <-time.After(pause):
			}
		}
	}
}

// end says how and when the tunnel ended; a zero time while it is open.
func (s *echoStream) end() (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endedAt, s.endErr
}

// drained waits until every byte sent came back, the tunnel ended, or
// within passed.
func (s *echoStream) drained(ctx context.Context, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if s.got.Load() >= s.sent.Load() {
			return true
		}
		select {
		case <-s.ended:
			return s.got.Load() >= s.sent.Load()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return s.got.Load() >= s.sent.Load()
}

// tallyStreams waits up to 10 s for each stream's echo to drain, then
// counts the streams that ended (with why each ended), the bytes sent
// and never echoed, and the bytes echoed wrong.
func tallyStreams(ctx context.Context, ss []*echoStream) (ended int, lost, wrong int64, why []string) {
	for _, s := range ss {
		s.drained(ctx, 10*time.Second)
		if at, err := s.end(); !at.IsZero() {
			ended++
			if err != nil {
				why = append(why, err.Error())
			}
		}
		lost += s.sent.Load() - s.got.Load()
		wrong += s.wrong.Load()
	}
	return ended, lost, wrong, why
}
