package faults

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/bench/simagent"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/loopback"
	"github.com/deskway/deskway/internal/tlsconf"
)

const (
	farmGroup    = "desk"
	farmFrontend = "faults-portal-token"
	farmTokenKey = "faults-token-key-0123456789abcdef0123456789"
	// farmHeartbeatTimeout is the brokers' broker.heartbeat_timeout, the
	// default's.
	farmHeartbeatTimeout = 30 * time.Second
)

// brokerNode is one of the brokers sharing the database: its own state
// directory (cache, journal), its own process. Its heartbeat_timeout is
// farmHeartbeatTimeout but in the link-agent case, which waits it out.
const brokerNode = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[11]d", tokens: ["faults-admin-token"]}
tls: {cert: %[2]s, key: %[3]s}
auth:
  token_key: "%[4]s"
broker:
  listen: "127.0.0.1:%[5]d"
  database: "%[6]s"
  gateway: "gateway.faults.test:443"
  heartbeat_interval: 1s
  heartbeat_timeout: %[13]s
  frontend_tokens: [%[7]s]
  peers: [%[12]s]
  delivery_groups:
  - {name: %[8]s, groups: [%[8]s], session_limit: %[9]d, logon_limit: %[10]d}
`

// brokerProc is a broker process.
type brokerProc struct {
	addr, state string
	cmd         *exec.Cmd
	done        chan struct{}
	log         *os.File
}

// startBrokerProc starts bin's broker role with args, listening on addr,
// its state in state and its output in state/broker.log.
func startBrokerProc(bin, addr, state string, args ...string) (*brokerProc, error) {
	lf, err := os.Create(filepath.Join(state, "broker.log"))
	if err != nil {
		return nil, err
	}
	b := &brokerProc{addr: addr, state: state, log: lf, done: make(chan struct{}),
		cmd: exec.Command(bin, append([]string{"broker"}, args...)...)}
	b.cmd.Stdout, b.cmd.Stderr = lf, lf
	if err := b.cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	return b, nil
}

// kill9 kills the broker at once, as a crash would.
func (b *brokerProc) kill9() {
	if b.cmd.Process != nil {
		_ = b.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-b.done
}

// brokerFarm is two (or more) brokers on one database, the session
// hosts they place on, and the balancer users and agents reach them
// through.
type brokerFarm struct {
	brokers []*brokerProc
	lb      *balancer
	hosts   map[string]*simHost
	limit   int
	// placed is where each user's session runs, as the launch answers
	// said; relaunching marks users launching again right now.
	placed      map[string]string
	relaunching map[string]bool
	usersMu     sync.Mutex
	// heldAtKill is how many launches the killed broker held.
	heldAtKill int
	stop       context.CancelFunc
	wg         sync.WaitGroup
}

// startBrokerFarm starts n brokers as processes of env.Bin on the
// database dsn, one after the other (the first migrates it), then
// registers hosts session hosts through the balancer and starts their
// agents.
func startBrokerFarm(ctx context.Context, env Env, dir, dsn string, n, hosts, sessionLimit, logonLimit int) (*brokerFarm, error) {
	return startBrokerFarmTimeout(ctx, env, dir, dsn, n, hosts, sessionLimit, logonLimit, farmHeartbeatTimeout)
}

// startBrokerFarmTimeout is startBrokerFarm with the brokers'
// broker.heartbeat_timeout.
func startBrokerFarmTimeout(ctx context.Context, env Env, dir, dsn string, n, hosts, sessionLimit, logonLimit int, heartbeatTimeout time.Duration) (*brokerFarm, error) {
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := tlsconf.SelfSigned(cert, key, []string{"127.0.0.1"}); err != nil {
		return nil, err
	}
	ctc, err := tlsconf.Trusting(cert)
	if err != nil {
		return nil, err
	}
	f := &brokerFarm{hosts: map[string]*simHost{}, limit: sessionLimit, placed: map[string]string{}, relaunching: map[string]bool{}}
	ok := false
	defer func() {
		if !ok {
			f.close()
		}
	}()
	// Every broker lists the others in broker.peers, so their ports are
	// chosen before any starts.
	ports := make([]int, n)
	for i := range ports {
		if ports[i], err = loopback.FreePort(); err != nil {
			return nil, fmt.Errorf("faults: %w", err)
		}
	}
	var bases []string
	for i, port := range ports {
		var peers []string
		for j, p := range ports {
			if j != i {
				peers = append(peers, fmt.Sprintf(`"https://127.0.0.1:%d"`, p))
			}
		}
		adminPort, err := loopback.FreePort()
		if err != nil {
			return nil, fmt.Errorf("faults: %w", err)
		}
		state := filepath.Join(dir, fmt.Sprintf("broker%d", i+1))
		if err := os.MkdirAll(state, 0o700); err != nil {
			return nil, fmt.Errorf("faults: %w", err)
		}
		cfg := filepath.Join(state, "deskway.yaml")
		text := fmt.Sprintf(brokerNode, state, cert, key, farmTokenKey, port, dsn, farmFrontend, farmGroup, sessionLimit, logonLimit, adminPort, strings.Join(peers, ", "), heartbeatTimeout)
		if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
			return nil, fmt.Errorf("faults: %w", err)
		}
		b, err := startBrokerProc(env.Bin, fmt.Sprintf("127.0.0.1:%d", port), state, "-c", cfg)
		if err != nil {
			return nil, fmt.Errorf("faults: start broker %d: %w", i+1, err)
		}
		f.brokers = append(f.brokers, b)
		if err := waitListening(ctx, b, 30*time.Second); err != nil {
			return nil, err
		}
		bases = append(bases, "https://"+b.addr)
	}
	f.lb = newBalancer(bases, ctc)
	tokens, err := auth.NewTokens([]byte(farmTokenKey), nil)
	if err != nil {
		return nil, fmt.Errorf("faults: %w", err)
	}
	join, err := tokens.MintJoin(farmGroup, "", time.Hour, 0)
	if err != nil {
		return nil, fmt.Errorf("faults: %w", err)
	}
	hctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	for i := range hosts {
		name := fmt.Sprintf("vda%03d", i+1)
		var reg *brokerapi.RegisterResponse
		err := f.lb.do(ctx, func(c *brokerclient.Client) error {
			var err error
			reg, err = c.Register(ctx, join, brokerapi.RegisterRequest{Name: name, Address: name + ".faults.test", Port: 3389})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("faults: register %s: %w", name, err)
		}
		h := &simHost{name: name, cred: reg.Credential, sessions: map[string]*hostSession{}, posts: map[string][]hostPost{}}
		f.hosts[name] = h
		f.wg.Add(1)
		go func() { defer f.wg.Done(); h.run(hctx, f.lb, 500*time.Millisecond, time.Second) }()
	}
	ok = true
	return f, nil
}

// waitListening waits until b accepts connections, or has exited.
func waitListening(ctx context.Context, b *brokerProc, within time.Duration) error {
	for deadline := time.Now().Add(within); ; {
		c, err := net.DialTimeout("tcp", b.addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-b.done:
			return fmt.Errorf("faults: the broker on %s exited at start: %s", b.addr, logTail(b.log.Name(), 600))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("faults: the broker on %s did not listen within %v", b.addr, within)
		}
	}
}

// journalsLeft reports whether any live broker still holds an offline
// journal that has not been written back.
func (f *brokerFarm) journalsLeft() bool {
	for _, b := range f.brokers {
		select {
		case <-b.done:
			continue
		default:
		}
		if _, err := os.Stat(filepath.Join(b.state, "broker-offline.journal")); err == nil {
			return true
		}
	}
	return false
}

func (f *brokerFarm) close() {
	if f.stop != nil {
		f.stop()
	}
	f.wg.Wait()
	for _, b := range f.brokers {
		b.kill9()
		b.log.Close()
	}
}

// balancer is how users and agents reach the brokers: what the shipped
// deploy/haproxy/broker-farm.cfg does, in the client. Requests go round
// robin to the brokers with no persistence; a broker that refuses the
// connection (it is dead) is skipped for the next one at once, as
// HAProxy's redispatch does. A request whose connection breaks after it
// was sent is not resent here: HAProxy cannot either, so the caller sees
// the error and tries again, as a portal or a user clicking again would.
type balancer struct {
	clients []*brokerclient.Client
	next    atomic.Uint64
	// launching counts the launches each broker holds.
	launching []atomic.Int64
}

// index is c's place in lb.clients.
func (lb *balancer) index(c *brokerclient.Client) int {
	for i, x := range lb.clients {
		if x == c {
			return i
		}
	}
	panic("faults: a client that is not the balancer's")
}

func newBalancer(bases []string, tc *tls.Config) *balancer {
	lb := &balancer{}
	for _, base := range bases {
		tr := &http.Transport{MaxIdleConnsPerHost: 128, IdleConnTimeout: 30 * time.Second, TLSClientConfig: tc}
		lb.clients = append(lb.clients, &brokerclient.Client{Base: base, MaxRetries: 100,
			HTTP: &http.Client{Timeout: 10 * time.Second, Transport: tr}})
	}
	lb.launching = make([]atomic.Int64, len(bases))
	return lb
}

// do runs call on the next broker, and on the ones after it while they
// refuse the connection.
func (lb *balancer) do(ctx context.Context, call func(c *brokerclient.Client) error) error {
	start := int(lb.next.Add(1))
	var err error
	for i := range lb.clients {
		err = call(lb.clients[(start+i)%len(lb.clients)])
		if !refused(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// refused reports whether err is a connection that was never made.
func refused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// hostSession is a session on a simulated host.
type hostSession struct {
	showAt time.Time
}

// simHost is a session host whose agent reports its sessions through
// the balancer as the real agent does: the events agent.Diff finds at
// each poll, and its session list in every heartbeat.
type simHost struct {
	name, cred string
	mu         sync.Mutex
	sessions   map[string]*hostSession
	// posts are the event reports the host made of each user's session,
	// for the timeline of a launch found lost.
	posts map[string][]hostPost
	beats []hostBeat
}

// connect is a user's client connecting to the host: the session shows
// once its logon is over.
func (h *simHost) connect(user string, logon time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.sessions[user]; !ok {
		h.sessions[user] = &hostSession{showAt: time.Now().Add(logon)}
	}
}

func (h *simHost) view(now time.Time) []brokerapi.Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []brokerapi.Session
	for u, s := range h.sessions {
		if !now.Before(s.showAt) {
			out = append(out, brokerapi.Session{User: u, State: "active"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].User < out[j].User })
	return out
}

// shown reports whether user's session has logged on.
func (h *simHost) shown(user string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[user]
	return ok && !now.Before(s.showAt)
}

// count is how many sessions the host holds, logged on or not.
func (h *simHost) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

func (h *simHost) run(ctx context.Context, lb *balancer, poll, beat time.Duration) {
	simagent.Agent{
		Host: h.name, Poll: poll, Beat: beat, View: h.view,
		Events: func(ctx context.Context, ev brokerapi.Events) {
			_ = lb.do(ctx, func(c *brokerclient.Client) error {
				at := time.Now()
				err := c.Events(ctx, h.cred, ev)
				h.posted(ev.Events, newBrokerCall(at, lb.index(c), err))
				return err
			})
		},
		Heartbeat: func(ctx context.Context, hb brokerapi.Heartbeat) {
			_ = lb.do(ctx, func(c *brokerclient.Client) error {
				at := time.Now()
				_, err := c.Heartbeat(ctx, h.cred, hb)
				h.beat(hb.Sessions, newBrokerCall(at, lb.index(c), err))
				return err
			})
		},
	}.Run(ctx)
}

// logTail is the end of a log file, for an error message.
func logTail(path string, n int) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b[max(0, len(b)-n):]))
}

// connected records that user's client connected to host.
func (f *brokerFarm) connected(user, host string) {
	f.usersMu.Lock()
	defer f.usersMu.Unlock()
	f.placed[user] = host
}

// relaunchable picks a user whose session has logged on and who is not
// launching again already, and marks them as launching again.
func (f *brokerFarm) relaunchable() (user, host string) {
	f.usersMu.Lock()
	defer f.usersMu.Unlock()
	now := time.Now()
	for u, h := range f.placed { // map order: a random pick
		// A user whose client dropped after a few seconds at their
		// desktop: two heartbeats after the logon.
		if f.relaunching[u] || !f.hosts[h].shown(u, now.Add(-2*time.Second)) {
			continue
		}
		f.relaunching[u] = true
		return u, h
	}
	return "", ""
}

// relaunched ends user's launching again.
func (f *brokerFarm) relaunched(user string) {
	f.usersMu.Lock()
	defer f.usersMu.Unlock()
	delete(f.relaunching, user)
}
