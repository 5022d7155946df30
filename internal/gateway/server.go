// Package gateway is the RD Gateway: it accepts MS-TSGU tunnels over
// websocket or the legacy RDG_IN_DATA/RDG_OUT_DATA pair, authenticates the
// user (NTLM over HTTP, or a PAA token in the tunnel), applies connection
// and resource policies, and relays bytes to the RDP host. It holds no state
// another gateway node would need: a farm shares only the token key.
package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/admission"
	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/proxylisten"
)

// Deps are what the gateway is built from; nothing is global.
type Deps struct {
	Logger   *slog.Logger
	Registry prometheus.Registerer
	Users    *auth.Users
	// Tokens verifies PAA cookies; nil disables PAA.
	Tokens   *auth.Tokens
	Policy   *policy.Engine
	Throttle *auth.Throttle
	// Authorizer asks a central policy server (RADIUS); nil when none.
	Authorizer Authorizer
	Domain     string
	// Dial connects to RDP hosts; nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TokenUses records PAA tokens' tunnels; nil keeps them in memory.
	TokenUses TokenUses
	// FarmKey authenticates the nodes of a farm to each other (FarmKey of
	// the token key); required when gateway.farm_peers is set.
	FarmKey []byte
	// FarmDatabase is farm.database: the farm's tunnel list is kept
	// there; empty lists this node's tunnels alone.
	FarmDatabase string
}

// Authorizer is a central connection policy check (RADIUS, like NPS).
type Authorizer interface {
	Authorize(ctx context.Context, id policy.Identity) (extraGroups []string, err error)
}

// Server is one gateway node.
type Server struct {
	cfg     config.Gateway
	deps    Deps
	log     *slog.Logger
	ntlm    *auth.NTLMServer
	metrics *metrics
	http    *http.Server
	loops   *relayLoops // nil: every tunnel relays on goroutines

	pa    *preauth
	conns sync.Map // *tls.Conn -> *connState, while net/http serves it
	// policy is the CAPs and RAPs in force; Reload swaps it.
	policy atomic.Pointer[policy.Engine]

	refused admission.Refusals

	mu      sync.Mutex // guards the fields below
	tunnels map[uint32]*tunnel
	open    int // authorized tunnels: what max_tunnels caps
	perUser map[string]int
	pending map[string]*pendingOut // legacy OUT halves waiting for their IN, by RDG-Connection-Id
	// forwarded are the legacy IN halves this node carries to the farm
	// peer that holds their OUT half: client connection to peer link.
	forwarded map[net.Conn]net.Conn
	// claims are this node's claims out to its peers, in all and by the
	// IN half's client address.
	claims     int
	claimsFrom map[netip.Addr]int
	// farmTLS dials peers (resuming sessions); farmCert is the
	// certificate every node of the farm serves, this node's own.
	farmTLS     *tls.Config
	farmCert    []byte
	peerTrouble admission.Refusals
	// farmTun is the farm's tunnel list, when there is a farm database.
	farmTun atomic.Pointer[farmTunnels]
	nextID  uint32
	closing bool
	wg      sync.WaitGroup // one per running tunnel
}

// New builds a server; it does not listen until Serve.
func New(cfg *config.Gateway, d Deps) (*Server, error) {
	if d.Logger == nil || d.Users == nil || d.Policy == nil || d.Throttle == nil {
		return nil, errors.New("gateway: logger, users, policy and throttle are required")
	}
	if d.Dial == nil {
		nd := &net.Dialer{Timeout: cfg.DialTimeout.D(), KeepAlive: 30 * time.Second}
		d.Dial = staggeredDialer{d: nd, stagger: hostDialStagger, attempts: hostDialAttempts}.DialContext
	}
	if d.TokenUses == nil {
		n := 1
		if cfg.TokenMaxUses != nil {
			n = *cfg.TokenMaxUses
		}
		if n == 0 {
			d.Logger.Warn("gateway.token_max_uses is 0: a PAA token opens any number of tunnels until it expires, from anywhere, so whoever sees one can replay it")
		}
		d.TokenUses = newMemTokenUses(n, cfg.ReconnectWindowD(), nil)
	}
	host, _ := os.Hostname()
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	s := &Server{
		cfg:     *cfg,
		deps:    d,
		log:     d.Logger,
		ntlm:    &auth.NTLMServer{Users: d.Users, Domain: d.Domain, Host: host},
		metrics: newMetrics(d.Registry),
		pa:      newPreauth(cfg.MaxUnauthenticated, cfg.MaxUnauthenticatedPerAddr, cfg.HandshakeTimeout.D()),
		tunnels: map[uint32]*tunnel{},
		perUser: map[string]int{},
		pending: map[string]*pendingOut{},

		forwarded:  map[net.Conn]net.Conn{},
		claimsFrom: map[netip.Addr]int{},
		// The peer's certificate is the farm's, not made out to the
		// address dialled: claimOn compares it with this node's own, and
		// the MACs, bound to the TLS session, prove the peer holds the
		// farm key.
		farmTLS: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}, //nolint:gosec // checked in claimOn
			ClientSessionCache: tls.NewLRUClientSessionCache(64)},
	}
	if len(cfg.FarmPeers) > 0 && len(d.FarmKey) < 32 {
		return nil, errors.New("gateway: farm_peers needs the farm key (auth.token_key set on every node)")
	}
	s.policy.Store(d.Policy)
	s.metrics.activeFunc(s.activeCount, s.pa.count)
	return s, nil
}

// Reload puts new users and policies in force for what comes next: a
// login checks the new users, a tunnel's policies are the new ones when
// it asks; open tunnels keep what they were granted.
func (s *Server) Reload(users *auth.Users, pol *policy.Engine) {
	s.deps.Users.Replace(users)
	s.policy.Store(pol)
	s.log.Info("users and policies reloaded")
}

type connKey struct{}

// admit starts a connection's pre-authentication phase, or closes it at
// once when the caps of unauthenticated connections are full.
func (s *Server) admit(c net.Conn) *connState {
	raw := c
	if tc, ok := c.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	now := time.Now()
	cs := &connState{remote: ap.Addr().Unmap(), pa: s.pa, raw: raw, accepted: now, deadline: now.Add(s.pa.budget), bare: bareFromBalancer(raw)}
	key, why := s.pa.admit(cs.remote)
	if why != "" {
		cs.key, cs.released, cs.expired = key, true, true
		_ = raw.Close()
		s.metrics.auth.WithLabelValues("connection", "over_capacity").Inc()
		s.refused.Log(s.log, "connection refused before TLS", cs.remote, why)
		return cs
	}
	cs.key = key
	s.conns.Store(c, cs)
	cs.start()
	return cs
}

// connClosed is net/http's word that a connection ended or left it.
func (s *Server) connClosed(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	if v, ok := s.conns.LoadAndDelete(c); ok && st == http.StateClosed {
		v.(*connState).finish()
	}
	// A hijacked connection's slot is the tunnel's (or the waiting legacy
	// half's) to give back.
}

// Serve accepts connections on ln (TLS is applied here) until ctx ends,
// then shuts down gracefully within the configured grace period.
func (s *Server) Serve(ctx context.Context, ln net.Listener, tlsCfg *tls.Config) error {
	tc := tlsCfg.Clone()
	if len(tc.Certificates) > 0 && len(tc.Certificates[0].Certificate) > 0 {
		s.farmCert = tc.Certificates[0].Certificate[0]
	}
	tc.NextProtos = []string{"http/1.1"} // MS-TSGU runs over HTTP/1.1 only
	s.http = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.cfg.HandshakeTimeout.D(),
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, s.admit(c))
		},
		ConnState: s.connClosed,
	}
	if s.deps.FarmDatabase != "" {
		ft, err := openFarmTunnels(ctx, s.deps.FarmDatabase, s)
		if err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		s.farmTun.Store(ft)
		go ft.run(ctx)
	}
	if len(s.cfg.ProxyProtocolFrom) > 0 {
		trusted, err := config.ParsePrefixes(s.cfg.ProxyProtocolFrom)
		if err != nil {
			return fmt.Errorf("gateway: proxy_protocol_from: %w", err)
		}
		if len(s.cfg.FarmPeers) > 0 {
			// A peer on the balancer's host (or behind its NAT) links
			// from the balancer's address, with no PROXY header: its
			// farm credential, not its address, lets it in (ServeHTTP).
			ln = proxylisten.NewAllowingBareTLS(ln, trusted, s.cfg.HandshakeTimeout.D(), s.log)
		} else {
			ln = proxylisten.New(ln, trusted, s.cfg.HandshakeTimeout.D(), s.log)
		}
	}
	if n := s.cfg.RelayLoops; n != nil && *n > 0 {
		loops, err := startRelayLoops(*n, s.cfg.Keepalive.D(), s.log)
		if err != nil {
			return fmt.Errorf("gateway: relay loops: %w", err)
		}
		s.loops = loops
		ln = loopListener{ln}
	}
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(tls.NewListener(ln, tc)) }()
	s.log.Info("gateway listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("gateway: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownGrace.D())
	defer cancel()
	err := s.Shutdown(sctx)
	if s.loops != nil {
		s.loops.close() // every tunnel has ended
	}
	return err
}

// Shutdown stops accepting and closes every connection that has not
// opened a channel, lets open tunnels finish until ctx ends, then closes
// the rest. Closing never waits on a peer, so it returns soon after ctx
// ends whatever the peers do.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	n := s.open
	s.mu.Unlock()
	s.log.Info("gateway shutting down", "open_tunnels", n)
	s.stopTunnels(false, "gateway shutting down")
	_ = s.http.Shutdown(ctx)
	_ = s.http.Close() // connections still in HTTP when ctx ended
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	s.stopTunnels(true, "gateway shutting down")
	select {
	case <-done:
		return nil
	case <-time.After(2 * closeWriteTimeout):
		return errors.New("gateway: tunnels still running after shutdown closed them")
	}
}

// stopTunnels stops the tunnels without an open channel, or all of them,
// and abandons waiting legacy halves. Stopping happens outside s.mu: a
// tunnel's end takes the lock too.
func (s *Server) stopTunnels(all bool, reason string) {
	s.mu.Lock()
	if all {
		for in, peer := range s.forwarded {
			_ = in.Close()
			_ = peer.Close()
		}
	}
	var stop []*tunnel
	for _, t := range s.tunnels {
		if all || !t.isOpen() {
			stop = append(stop, t)
		}
	}
	var pend []*pendingOut
	for id, p := range s.pending {
		pend = append(pend, p)
		delete(s.pending, id)
	}
	s.mu.Unlock()
	for _, t := range stop {
		t.stopFor(reason, tsgu.EProxyConnectionAborted)
	}
	for _, p := range pend {
		p.abandon()
	}
}

// ServeHTTP routes the two RDG methods; everything else is 404.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cs, _ := r.Context().Value(connKey{}).(*connState)
	if cs == nil {
		cs = &connState{}
	}
	if cs.bare && (r.URL.Path != farmPath || r.Method != http.MethodPost) {
		// Through the balancer every client connection starts with a
		// PROXY header; one without came from the balancer's host, where
		// only a farm peer's link, which proves itself, is served.
		s.refused.Log(s.log, "request refused: it came from a trusted load balancer's address without a PROXY header, where only farm peers' links are served (HAProxy: send-proxy-v2, and check-send-proxy for health checks)",
			cs.remote, r.Method+" "+r.URL.Path)
		plain(w, http.StatusForbidden, "")
		return
	}
	switch r.Method {
	case "RDG_OUT_DATA", "RDG_IN_DATA":
	default:
		if r.URL.Path == browserPath && r.Method == http.MethodGet {
			s.serveBrowser(w, r, cs)
			return
		}
		if r.URL.Path == farmPath && r.Method == http.MethodPost && len(s.cfg.FarmPeers) > 0 {
			s.serveFarmIn(w, r, cs)
			return
		}
		if r.URL.Path == "/healthz" && r.Method == http.MethodGet {
			plain(w, http.StatusOK, "ok\n")
			return
		}
		plain(w, http.StatusNotFound, "")
		return
	}
	if s.isClosing() {
		plain(w, http.StatusServiceUnavailable, "")
		return
	}
	began := time.Now()
	method, ok := s.authenticateHTTP(w, r, cs)
	if !ok {
		// NTLM's challenge, or a refusal: answered.
		cs.served.Add(int64(time.Since(began)))
		return
	}
	connID := r.Header.Get("RDG-Connection-Id")
	hs := handshakeInfo{user: cs.user, method: method, remote: cs.remote, connID: connID, conns: []*connState{cs}, began: began}
	switch {
	case r.Method == "RDG_OUT_DATA" && strings.EqualFold(r.Header.Get("Upgrade"), "websocket"):
		s.serveWebsocket(w, r, hs)
	case r.Method == "RDG_OUT_DATA":
		s.serveLegacyOut(w, r, hs)
	default:
		s.serveLegacyIn(w, r, hs)
	}
}

// isClosing reports whether shutdown has begun: new tunnels are refused.
func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// plain writes an empty or text/plain body: xfreerdp reads error bodies
// only for a few content types and chokes on others.
func plain(w http.ResponseWriter, code int, body string) {
	if code >= 400 && code != http.StatusUnauthorized {
		// Refusals end the connection; otherwise net/http would first try to
		// drain a request body that, for RDG_IN_DATA, never ends.
		w.Header().Set("Connection", "close")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write([]byte(body))
}

const websocketGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
