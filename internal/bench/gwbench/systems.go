// Package gwbench rebuilds the RD Gateway capacity tests (TSGSClient and
// TSGSServer) and the ctsTraffic throughput test for deskway: it starts
// the echo server, the gateway and the baselines as separate processes,
// ramps tunnels through each, and writes the papers' tables.
package gwbench

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/bench/load"
	"github.com/deskway/deskway/internal/loopback"
	"github.com/deskway/deskway/internal/tlsconf"
	"github.com/deskway/deskway/internal/tsgclient"
)

// env is what every system in one bench run shares: certificates, keys and
// the echo server.
type env struct {
	dir               string
	exe               string
	cert, key, pem    string
	tokenKey          string
	tokens            *auth.Tokens
	echoAddr, echoTLS string
	echoPort          uint16
	echo              *proc
	clientTLS         *tls.Config
	relayLoops        int // the gateway's relay_loops; negative: its default
}

// proc is a child process started by the bench. One goroutine waits for
// it, and everyone else waits on exited: exec.Cmd.Wait may be called only
// once, and a second, concurrent call can block for ever on the output
// copy the first one already collected.
type proc struct {
	cmd    *exec.Cmd
	log    *bytes.Buffer
	name   string
	exited chan struct{} // closed once the process has been reaped
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop asks the process to end (SIGTERM) and kills it after 5 s.
func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// kill ends the process at once (a node failing) and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// startProc runs argv with extra environment; cpus > 0 pins it with taskset.
func startProc(name string, cpus int, extraEnv []string, argv ...string) (*proc, error) {
	if cpus > 0 {
		list := make([]string, cpus)
		for i := range list {
			list[i] = strconv.Itoa(i)
		}
		argv = append([]string{"taskset", "-c", strings.Join(list, ",")}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), extraEnv...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", name, err)
	}
	p := &proc{cmd: cmd, log: &log, name: name, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func newEnv(exe, dir string, relayLoops int) (*env, error) {
	e := &env{dir: dir, exe: exe, tokenKey: "bench-token-key-0123456789abcdef0123456789", relayLoops: relayLoops}
	e.cert, e.key = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := tlsconf.SelfSigned(e.cert, e.key, nil); err != nil {
		return nil, err
	}
	// HAProxy wants certificate and key in one file.
	c, _ := os.ReadFile(e.cert)
	k, _ := os.ReadFile(e.key)
	e.pem = filepath.Join(dir, "tls.pem")
	if err := os.WriteFile(e.pem, append(c, k...), 0o600); err != nil {
		return nil, err
	}
	var err error
	if e.tokens, err = auth.NewTokens([]byte(e.tokenKey), nil); err != nil {
		return nil, err
	}
	// Session resumption off: every tunnel does a full handshake, as
	// separate client machines would.
	e.clientTLS = &tls.Config{InsecureSkipVerify: true, ClientSessionCache: nil}
	p1, err := loopback.FreePort()
	if err != nil {
		return nil, err
	}
	p2, err := loopback.FreePort()
	if err != nil {
		return nil, err
	}
	e.echoAddr, e.echoTLS, e.echoPort = fmt.Sprintf("127.0.0.1:%d", p1), fmt.Sprintf("127.0.0.1:%d", p2), uint16(p1)
	e.echo, err = startProc("echo-server", 0, nil, exe, "bench", "echo-server", "--listen", e.echoAddr,
		"--tls-listen", e.echoTLS, "--cert", e.cert, "--key", e.key)
	if err != nil {
		return nil, err
	}
	if err := loopback.WaitPort(e.echoTLS, 10*time.Second); err != nil {
		e.echo.stop()
		return nil, fmt.Errorf("%w\n%s", err, e.echo.log.String())
	}
	return e, nil
}

func (e *env) close() { e.echo.stop() }

// system is one thing the bench measures: deskway, the direct path, or a peer.
type system struct {
	name string
	// start launches it (cpus > 0 pins it) and returns the process to
	// sample (nil for direct), a dialer to the echo server through it, and
	// the TLS address its clients reach, whose handshake the bench records.
	start func(cpus int) (*proc, load.Dialer, string, error)
}

func (e *env) direct() system {
	return system{name: "direct", start: func(int) (*proc, load.Dialer, string, error) {
		return nil, e.tlsDialer(e.echoTLS), e.echoTLS, nil
	}}
}

// tlsSuite is the protocol version and cipher suite that a client of the
// bench negotiates with addr: every system must agree, or a ratio would
// compare ciphers instead of relays.
func (e *env) tlsSuite(ctx context.Context, addr string) (string, error) {
	d := &tls.Dialer{Config: e.clientTLS}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("bench: TLS handshake with %s: %w", addr, err)
	}
	defer c.Close()
	st := c.(*tls.Conn).ConnectionState()
	return tls.VersionName(st.Version) + " " + tls.CipherSuiteName(st.CipherSuite), nil
}

func (e *env) tlsDialer(addr string) load.Dialer {
	return load.NetDialer(func(ctx context.Context) (net.Conn, error) {
		d := &tls.Dialer{Config: e.clientTLS}
		return d.DialContext(ctx, "tcp", addr)
	})
}

const gatewayYAML = `state_dir: %[1]s
log: {level: warn, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: [bench-admin]}
tls: {cert: %[3]s, key: %[4]s}
auth:
  token_key: %[5]s
gateway:
  listen: "127.0.0.1:%[6]d"
  auth_methods: [paa]
  max_tunnels: 100000
  token_max_uses: 0   # every load tunnel presents the same token
  max_unauthenticated: 100000
  max_unauthenticated_per_address: 100000
  connection_policies: [{name: bench, users: ["*"]}]
  resource_policies: [{name: echo, users: ["*"], hosts: [127.0.0.1]}]
`

// The TLS 1.3 suite every system is held to, and HAProxy's buffer size:
// deskway's relay reads 64 KiB at a time.
const (
	benchCipherSuite = "TLS_AES_128_GCM_SHA256"
	haproxyBufSize   = 64 << 10
)

// startGateway runs one deskway gateway node and returns its address.
func (e *env) startGateway(cpus int, extraYAML ...string) (*proc, string, error) {
	return e.startGatewayOf(e.exe, cpus, extraYAML...)
}

// startGatewayOf is startGateway with the gateway of the binary exe.
func (e *env) startGatewayOf(exe string, cpus int, extraYAML ...string) (*proc, string, error) {
	// A port found free can be taken before the gateway binds it (by any
	// process's outgoing connection): then try other ports.
	for attempt := 1; ; attempt++ {
		p, addr, err := e.startGatewayOnce(exe, cpus, extraYAML)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return p, addr, err
		}
	}
}

func (e *env) startGatewayOnce(exe string, cpus int, extraYAML []string) (*proc, string, error) {
	gp, err := loopback.FreePort()
	if err != nil {
		return nil, "", err
	}
	ap, err := loopback.FreePort()
	if err != nil {
		return nil, "", err
	}
	dir, err := os.MkdirTemp(e.dir, "gw")
	if err != nil {
		return nil, "", err
	}
	cfg := filepath.Join(dir, "deskway.yaml")
	body := fmt.Sprintf(gatewayYAML, dir, ap, e.cert, e.key, e.tokenKey, gp)
	if e.relayLoops >= 0 {
		body += fmt.Sprintf("  relay_loops: %d\n", e.relayLoops)
	}
	body += strings.Join(extraYAML, "")
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		return nil, "", err
	}
	var env []string
	if cpus > 0 {
		env = append(env, fmt.Sprintf("GOMAXPROCS=%d", cpus))
	}
	p, err := startProc("deskway gateway", cpus, env, exe, "gateway", "-c", cfg)
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", gp)
	if err := loopback.WaitPort(addr, 10*time.Second); err != nil {
		p.stop()
		return nil, "", fmt.Errorf("%w\n%s", err, p.log.String())
	}
	return p, addr, nil
}

// gatewayDialer opens tunnels with the MS-TSGU client over websocket, with
// a PAA token, to the echo server; addrs rotate like round-robin DNS.
func (e *env) gatewayDialer(addrs func() string) (load.Dialer, error) {
	tok, err := e.tokens.Mint("bench", nil, "127.0.0.1", int(e.echoPort), 24*time.Hour)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (io.ReadWriteCloser, error) {
		cfg := tsgclient.Config{Gateway: addrs(), TLS: e.clientTLS, Token: tok, Transport: tsgclient.Websocket}
		return tsgclient.Dial(ctx, cfg, "127.0.0.1", e.echoPort)
	}, nil
}

func (e *env) deskway() system { return e.gatewayFrom("deskway", e.exe) }

// gatewayFrom is the system name: the gateway of the deskway binary exe.
func (e *env) gatewayFrom(name, exe string) system {
	return system{name: name, start: func(cpus int) (*proc, load.Dialer, string, error) {
		p, addr, err := e.startGatewayOf(exe, cpus)
		if err != nil {
			return nil, nil, "", err
		}
		d, err := e.gatewayDialer(func() string { return addr })
		if err != nil {
			p.stop()
			return nil, nil, "", err
		}
		return p, d, addr, nil
	}}
}

// HAProxy is tuned as an operator would for this load: a thread per CPU,
// buffers as large as deskway's 64 KiB reads (its 16 KiB default moves
// bulk data in smaller pieces), room for every tunnel of the ramp, and
// the TLS 1.3 cipher suite that Go's servers (deskway, the echo server)
// pick on a CPU with AES instructions.
const haproxyCfg = `global
  maxconn 9000
  nbthread %[1]d
  tune.bufsize %[5]d
  ssl-default-bind-ciphersuites ` + benchCipherSuite + `
  ssl-default-bind-options ssl-min-ver TLSv1.3
  log stderr format raw local0 err
defaults
  mode tcp
  timeout connect 5s
  timeout client 1h
  timeout server 1h
frontend fe
  bind 127.0.0.1:%[2]d ssl crt %[3]s alpn http/1.1
  default_backend be
backend be
  server echo %[4]s
`

// farmHAProxyCfg is deploy/haproxy/gateway-farm.cfg as the bench runs it:
// TLS passed through, round robin with no persistence, a PROXY v2 header
// first, health checks; HAProxy reaches the nodes from 127.0.0.2, the
// address they trust for the header. Threads and connection limits are
// the bench's.
const farmHAProxyCfg = `global
  maxconn 9000
  nbthread %[1]d
  log stderr format raw local0 err
defaults
  mode tcp
  option redispatch
  retries 2
  timeout connect 5s
  timeout client 1h
  timeout server 1h
frontend rdgateway
  bind 127.0.0.1:%[2]d
  default_backend gateways
backend gateways
  balance roundrobin
  source 127.0.0.2
  option httpchk GET /healthz
  http-check expect status 200
  default-server send-proxy-v2 check check-ssl check-send-proxy verify none inter 2s fall 2 rise 2
%[3]s`

// farmBehindHAProxy is nodes gateway processes behind HAProxy as
// deploy/haproxy/gateway-farm.cfg sets it up; the first node is
// sampled, and HAProxy and the other nodes stop with it.
func (e *env) farmBehindHAProxy(nodes int) system {
	return system{name: fmt.Sprintf("deskway-%dnode-haproxy", nodes), start: func(cpus int) (*proc, load.Dialer, string, error) {
		if _, err := exec.LookPath("haproxy"); err != nil {
			return nil, nil, "", errors.New("haproxy is not installed (apt-get install haproxy)")
		}
		var procs []*proc
		stopAll := func() {
			for _, q := range procs {
				q.stop()
			}
		}
		var servers strings.Builder
		for i := 0; i < nodes; i++ {
			p, a, err := e.startGateway(cpus, "  proxy_protocol_from: [127.0.0.2]\n")
			if err != nil {
				stopAll()
				return nil, nil, "", err
			}
			procs = append(procs, p)
			fmt.Fprintf(&servers, "  server gw%d %s\n", i+1, a)
		}
		port, err := loopback.FreePort()
		if err != nil {
			stopAll()
			return nil, nil, "", err
		}
		threads := cpus
		if threads == 0 {
			threads = runtime.NumCPU()
		}
		cfg := filepath.Join(e.dir, fmt.Sprintf("haproxy-farm-%d.cfg", port))
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(farmHAProxyCfg, threads, port, servers.String())), 0o600); err != nil {
			stopAll()
			return nil, nil, "", err
		}
		lb, err := startProc("haproxy", cpus, nil, "haproxy", "-db", "-f", cfg)
		if err != nil {
			stopAll()
			return nil, nil, "", err
		}
		procs = append(procs, lb)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := loopback.WaitPort(addr, 10*time.Second); err != nil {
			stopAll()
			return nil, nil, "", fmt.Errorf("%w\n%s", err, lb.log.String())
		}
		d, err := e.gatewayDialer(func() string { return addr })
		if err != nil {
			stopAll()
			return nil, nil, "", err
		}
		first := procs[0]
		go func() {
			<-first.exited
			for _, q := range procs[1:] {
				q.stop()
			}
		}()
		return first, d, addr, nil
	}}
}

// haproxy is the best general-purpose relay a user could pick instead:
// TLS terminated, plain TCP to the host.
func (e *env) haproxy() (system, error) {
	if _, err := exec.LookPath("haproxy"); err != nil {
		return system{}, errors.New("haproxy is not installed (apt-get install haproxy)")
	}
	return system{name: "haproxy", start: func(cpus int) (*proc, load.Dialer, string, error) {
		port, err := loopback.FreePort()
		if err != nil {
			return nil, nil, "", err
		}
		threads := cpus
		if threads == 0 {
			threads = runtime.NumCPU()
		}
		cfg := filepath.Join(e.dir, fmt.Sprintf("haproxy-%d.cfg", port))
		body := fmt.Sprintf(haproxyCfg, threads, port, e.pem, e.echoAddr, haproxyBufSize)
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			return nil, nil, "", err
		}
		p, err := startProc("haproxy", cpus, nil, "haproxy", "-db", "-f", cfg)
		if err != nil {
			return nil, nil, "", err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if err := loopback.WaitPort(addr, 10*time.Second); err != nil {
			p.stop()
			return nil, nil, "", fmt.Errorf("%w\n%s", err, p.log.String())
		}
		return p, e.tlsDialer(addr), addr, nil
	}}, nil
}
