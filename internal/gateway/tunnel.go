package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proto/tsgu"
)

// state is where a tunnel is in the MS-TSGU sequence.
type state int

const (
	stateHandshake state = iota
	stateTunnelCreate
	stateTunnelAuth
	stateChannelCreate
	stateOpen
)

// tunnel is one client's tunnel. The goroutine running run owns every field
// up to the channel opening; after that, the fields read by the admin API
// are either immutable or atomic.
type tunnel struct {
	id        uint32
	srv       *Server
	t         transport
	log       *slog.Logger
	hs        handshakeInfo
	transport string
	started   time.Time

	// Set during the handshake, immutable once the channel is open.
	ident      policy.Identity
	grant      *policy.Grant
	claims     *auth.Claims
	target     *policy.Target
	clientName string
	clientCaps uint32
	counted    bool // counted in perUser and open
	upstream   net.Conn
	tokenEnd   func(UseEnd) // ends the token's use, when a token opened the tunnel
	// revoked is set when an administrator disconnects the tunnel: its
	// token then opens no more tunnels.
	revoked atomic.Bool

	bytesUp, bytesDown atomic.Uint64
	// lastInput is the unix nanos of the last data from the client: only
	// the user's input keeps a tunnel from its idle timeout, as on RD
	// Gateway, not what the host sends (an animated desktop).
	lastInput atomic.Int64
	lastSend  atomic.Int64
	open      atomic.Bool               // the channel is open
	onLoop    atomic.Pointer[loopRelay] // set while an event loop relays it

	hostMu     sync.Mutex // guards host and hostClosed
	host       net.Conn   // the host connection, for stop to close
	hostClosed bool
	stopOnce   sync.Once
	reason     atomic.Pointer[string]
	relayDone  atomic.Bool
	watchdog   atomic.Pointer[time.Timer]

	// served is the gateway's own working time in the TSGU handshake,
	// from holding each request to having written its reply (the dial
	// included), and dial the resource dial's: what of open_ms is not
	// the client's or the network's.
	served, dial time.Duration
}

// runTunnel registers an MS-TSGU tunnel, runs it to the end and cleans up.
func (s *Server) runTunnel(t transport, hs handshakeInfo, kind string) {
	s.runWith(t, hs, kind, (*tunnel).run)
}

// runWith registers a tunnel of any kind, runs it with run and cleans up.
func (s *Server) runWith(t transport, hs handshakeInfo, kind string, run func(*tunnel) error) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		t.close()
		return
	}
	s.nextID++
	tn := &tunnel{id: s.nextID, srv: s, t: t, hs: hs, transport: kind, started: time.Now()}
	s.tunnels[tn.id] = tn
	s.wg.Add(1)
	s.mu.Unlock()
	tn.log = s.log.With("tunnel", tn.id, "remote", hs.remote.String(), "transport", kind)
	if hs.user != nil {
		tn.log = tn.log.With("user", hs.user.Name)
	}
	if err := run(tn); !errors.Is(err, errOnLoop) {
		tn.finish(err)
	}
}

// errOnLoop is what a tunnel's run returns once an event loop relays it:
// the loop finishes the tunnel when the relay ends, so the goroutine that
// ran the handshake, net/http's with its stack, buffers and request (at
// 1,000 tunnels about half the gateway's memory), ends here.
var errOnLoop = errors.New("gateway: the tunnel is relayed on an event loop")

// finish stops the tunnel, gives back its slots and token and logs it;
// err is how its run ended.
func (tn *tunnel) finish(err error) {
	s, hs := tn.srv, tn.hs
	defer s.wg.Done()
	tn.stop("")
	for _, c := range hs.conns {
		c.finish()
	}
	if tn.tokenEnd != nil {
		how := UseUnopened
		switch {
		case tn.revoked.Load():
			how = UseRevoked
		case tn.isOpen():
			how = UseEnded
		}
		tn.tokenEnd(how)
	}

	s.mu.Lock()
	delete(s.tunnels, tn.id)
	if tn.counted {
		s.open--
		if s.perUser[tn.ident.User]--; s.perUser[tn.ident.User] <= 0 {
			delete(s.perUser, tn.ident.User)
		}
	}
	s.mu.Unlock()

	result := "ok"
	if err != nil {
		result = "error"
	}
	if tn.target == nil {
		result = "refused"
	}
	s.metrics.tunnels.WithLabelValues(result).Inc()
	attrs := []any{"bytes_up", tn.bytesUp.Load(), "bytes_down", tn.bytesDown.Load(),
		"duration", time.Since(tn.started).Round(time.Millisecond).String()}
	if tn.target != nil {
		attrs = append(attrs, "target", tn.target.Addr.String())
	}
	if r := tn.reason.Load(); r != nil && *r != "" {
		attrs = append(attrs, "reason", *r)
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) {
		attrs = append(attrs, "err", err.Error())
	}
	tn.log.Info("tunnel closed", attrs...)
}

// stop ends the tunnel, from any goroutine, closing both sides; it never
// waits on a peer.
func (tn *tunnel) stop(reason string) {
	tn.stopOnce.Do(func() {
		if reason != "" {
			tn.reasonf("%s", reason)
		}
		tn.t.close()
		tn.closeHost()
	})
}

// stopFor stops the tunnel (admin, shutdown, timeouts) and tells a client
// with an open channel why: the reason as a service message where the
// client takes them, then a CLOSE_CHANNEL with code.
func (tn *tunnel) stopFor(reason string, code tsgu.HRESULT) {
	tn.stopOnce.Do(func() {
		tn.reasonf("%s", reason)
		var final [][]byte
		if tn.isOpen() {
			if tn.clientCaps&tsgu.CapMessagingServiceMsg != 0 {
				if b, err := (&tsgu.ServiceMessage{Message: "Disconnected: " + reason}).Append(nil); err == nil {
					final = append(final, b)
				}
			}
			if b, err := (&tsgu.CloseChannel{StatusCode: code}).Append(nil); err == nil {
				final = append(final, b)
			}
		}
		tn.t.close(final...)
		tn.closeHost()
	})
}

// isOpen reports whether the channel is open.
func (tn *tunnel) isOpen() bool { return tn.open.Load() }

// setHost records the host connection so stop can close it; it refuses
// (closing conn) once the tunnel is stopping.
func (tn *tunnel) setHost(conn net.Conn) bool {
	tn.hostMu.Lock()
	defer tn.hostMu.Unlock()
	if tn.hostClosed {
		conn.Close()
		return false
	}
	tn.host = conn
	return true
}

func (tn *tunnel) closeHost() {
	tn.hostMu.Lock()
	defer tn.hostMu.Unlock()
	tn.hostClosed = true
	if tn.host != nil {
		_ = tn.host.Close()
	}
}

// responseFor maps a request type to the response type that carries an error for it.
func responseFor(t tsgu.PacketType, code tsgu.HRESULT) tsgu.Message {
	switch t {
	case tsgu.TypeHandshakeRequest:
		return &tsgu.HandshakeResponse{ErrorCode: code, VerMajor: 1}
	case tsgu.TypeTunnelCreate:
		return &tsgu.TunnelResponse{ServerVersion: 1, StatusCode: code}
	case tsgu.TypeTunnelAuth:
		return &tsgu.TunnelAuthResponse{ErrorCode: code}
	case tsgu.TypeChannelCreate:
		return &tsgu.ChannelResponse{ErrorCode: code}
	case tsgu.TypeExtendedAuth:
		return &tsgu.ExtendedAuth{ErrorCode: code}
	case tsgu.TypeCloseChannel:
		return &tsgu.CloseChannelResponse{StatusCode: code}
	}
	return nil
}

// refusal is an error to report to the client in the response to a packet.
type refusal struct {
	pkt    tsgu.PacketType
	code   tsgu.HRESULT
	reason string
}

func (r *refusal) Error() string {
	return fmt.Sprintf("%s refused with %s: %s", r.pkt, r.code, r.reason)
}

func (tn *tunnel) send(m tsgu.Message) error {
	b, err := m.Append(nil)
	if err != nil {
		return err
	}
	tn.lastSend.Store(time.Now().UnixNano())
	return tn.t.writePacket(b)
}

// run drives the handshake and then the relay.
func (tn *tunnel) run() error {
	_ = tn.t.setReadDeadline(tn.hs.deadline())
	st := stateHandshake
	for st != stateOpen {
		pkt, err := tn.t.readPacket()
		if err != nil {
			if tn.budgetSpent() {
				tn.reasonf("no channel open within the handshake budget of %s", tn.srv.cfg.HandshakeTimeout.D())
			} else {
				tn.reasonf("client went away during handshake: %v", err)
			}
			return err
		}
		began := time.Now()
		h, _ := tsgu.ParseHeader(pkt)
		msg, err := tsgu.Decode(pkt)
		if err != nil {
			return tn.refuse(&refusal{h.Type, tsgu.EBadArguments, err.Error()}, "malformed packet")
		}
		next, err := tn.step(st, msg)
		if err != nil {
			var r *refusal
			if errors.As(err, &r) {
				return tn.refuse(r, "refused")
			}
			return err
		}
		st = next
		tn.served += time.Since(began)
	}
	tn.opened("http_ms", ms(tn.hs.httpServed()), "served_ms", ms(tn.served), "dial_ms", ms(tn.dial))
	_ = tn.t.setReadDeadline(time.Time{})
	return tn.relay()
}

// budgetSpent reports whether a connection's pre-authentication budget
// ran out.
func (tn *tunnel) budgetSpent() bool {
	// The read deadline is the budget's end too, and may fire before the
	// timer that marks the connections.
	if d := tn.hs.deadline(); !d.IsZero() && !time.Now().Before(d) {
		return true
	}
	for _, c := range tn.hs.conns {
		if c.timedOut() {
			return true
		}
	}
	return false
}

func (tn *tunnel) reasonf(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	tn.reason.CompareAndSwap(nil, &s)
}

// refuse sends the error response for the offending packet and ends the tunnel.
func (tn *tunnel) refuse(r *refusal, what string) error {
	tn.reasonf("%s", r.reason)
	level := slog.LevelInfo
	if r.code == tsgu.EBadArguments || r.code == tsgu.EAccessDenied {
		level = slog.LevelWarn // a misbehaving client
	}
	tn.log.Log(context.Background(), level, "tunnel "+what, "packet", r.pkt.String(), "status", r.code.String(), "reason", r.reason)
	if m := responseFor(r.pkt, r.code); m != nil {
		_ = tn.send(m)
	}
	return r
}

// step handles one handshake packet in state st.
func (tn *tunnel) step(st state, msg tsgu.Message) (state, error) {
	expect := map[state]tsgu.PacketType{
		stateHandshake:     tsgu.TypeHandshakeRequest,
		stateTunnelCreate:  tsgu.TypeTunnelCreate,
		stateTunnelAuth:    tsgu.TypeTunnelAuth,
		stateChannelCreate: tsgu.TypeChannelCreate,
	}[st]
	if msg.Type() == tsgu.TypeKeepalive {
		return st, nil
	}
	if msg.Type() != expect {
		return st, &refusal{msg.Type(), tsgu.EAccessDenied, fmt.Sprintf("got %s while waiting for %s", msg.Type(), expect)}
	}
	switch m := msg.(type) {
	case *tsgu.HandshakeRequest:
		return tn.handshake(m)
	case *tsgu.TunnelCreate:
		return tn.tunnelCreate(m)
	case *tsgu.TunnelAuth:
		return tn.tunnelAuth(m)
	case *tsgu.ChannelCreate:
		return tn.channelCreate(m)
	}
	return st, fmt.Errorf("gateway: unhandled %s", msg.Type())
}

func (tn *tunnel) handshake(m *tsgu.HandshakeRequest) (state, error) {
	if m.VerMajor != 1 {
		return 0, &refusal{m.Type(), tsgu.EProxyCapabilityMismatch, fmt.Sprintf("protocol version %d.%d not supported", m.VerMajor, m.VerMinor)}
	}
	ext := tsgu.ExtAuthNone
	switch tn.hs.method {
	case policy.MethodPAA:
		if m.ExtendedAuth&tsgu.ExtAuthPAA == 0 {
			return 0, &refusal{m.Type(), tsgu.EProxyUnsupportedAuthenticationMeth, "unauthenticated HTTP connection without PAA"}
		}
		ext = tsgu.ExtAuthPAA
	case policy.MethodNTLM:
		if m.ExtendedAuth&tsgu.ExtAuthPAA != 0 && tn.srv.deps.Tokens != nil {
			ext = tsgu.ExtAuthPAA // the token is checked as well
		}
	}
	if err := tn.send(&tsgu.HandshakeResponse{VerMajor: 1, VerMinor: 0, ExtendedAuth: ext}); err != nil {
		return 0, err
	}
	return stateTunnelCreate, nil
}

func (tn *tunnel) tunnelCreate(m *tsgu.TunnelCreate) (state, error) {
	tn.clientCaps = m.Capabilities
	var cookie *string
	if m.PAACookie != nil {
		c := m.CookieString()
		cookie = &c
	}
	if err := tn.authorize(m.Type(), cookie); err != nil {
		return 0, err
	}
	s := tn.srv
	resp := &tsgu.TunnelResponse{ServerVersion: 1, HasTunnelID: true, TunnelID: tn.id, HasCaps: true,
		Capabilities: m.Capabilities & (tsgu.CapIdleTimeout | tsgu.CapMessagingConsentSign | tsgu.CapMessagingServiceMsg)}
	if s.cfg.ConsentMessage != "" && m.Capabilities&tsgu.CapMessagingConsentSign != 0 {
		resp.HasConsent, resp.ConsentMsg = true, s.cfg.ConsentMessage
	}
	if err := tn.send(resp); err != nil {
		return 0, err
	}
	return stateTunnelAuth, nil
}

func (tn *tunnel) tunnelAuth(m *tsgu.TunnelAuth) (state, error) {
	tn.clientName = m.ClientName
	g := tn.grant
	resp := &tsgu.TunnelAuthResponse{HasRedirFlags: true, RedirFlags: g.RedirFlags}
	if g.IdleTimeout > 0 {
		resp.HasIdleTimeout = true
		resp.IdleTimeoutMinutes = uint32((g.IdleTimeout + time.Minute - 1) / time.Minute)
	}
	if err := tn.send(resp); err != nil {
		return 0, err
	}
	if msg := tn.srv.cfg.ServiceMessage; msg != "" && tn.clientCaps&tsgu.CapMessagingServiceMsg != 0 {
		if err := tn.send(&tsgu.ServiceMessage{Message: msg}); err != nil {
			return 0, err
		}
	}
	return stateChannelCreate, nil
}

func (tn *tunnel) channelCreate(m *tsgu.ChannelCreate) (state, error) {
	names := append(append([]string(nil), m.Resources...), m.AltResources...)
	if err := tn.connect(m.Type(), names, m.Port); err != nil {
		return 0, err
	}
	// Open before the client hears so: a shutdown that begins the
	// moment the client has its channel must give it the grace period.
	tn.open.Store(true)
	if err := tn.send(&tsgu.ChannelResponse{HasChannelID: true, ChannelID: 1}); err != nil {
		return 0, err
	}
	return stateOpen, nil
}

// opened logs and counts a tunnel whose channel is open. open_ms is the
// gateway's own share of the client's wait for its desktop: from
// accepting the tunnel's first connection (TCP, before TLS) to the
// channel open. extra are further attributes for the line.
func (tn *tunnel) opened(extra ...any) {
	tg := tn.target
	var first time.Time
	for _, c := range tn.hs.conns {
		if !c.accepted.IsZero() && (first.IsZero() || c.accepted.Before(first)) {
			first = c.accepted
		}
	}
	openMS := 0.0
	if !first.IsZero() {
		openMS = ms(time.Since(first))
	}
	tn.log.Info("tunnel open", append([]any{"target", tg.Addr.String(), "name", tg.Name, "client_name", tn.clientName,
		"connection_policy", tn.grant.Policy, "resource_policy", tg.Policy, "method", tn.ident.Method, "open_ms", openMS}, extra...)...)
	tn.srv.metrics.opened.Inc()
}

// connect finds the first of names (at port) that the token and the
// resource policies allow and that answers, and connects to it: the
// connection is tn.upstream, its target tn.target.
func (tn *tunnel) connect(pkt tsgu.PacketType, names []string, port uint16) error {
	s := tn.srv
	var lastErr *refusal
	for _, name := range names {
		if c := tn.claims; c != nil && (!strings.EqualFold(strings.TrimSuffix(name, "."), c.Host) || int(port) != c.Port) {
			lastErr = &refusal{pkt, tsgu.EProxyRAPAccessDenied, fmt.Sprintf("token allows %s, client asked for %s",
				net.JoinHostPort(c.Host, strconv.Itoa(c.Port)), net.JoinHostPort(name, strconv.Itoa(int(port))))}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DialTimeout.D())
		tg, err := s.policy.Load().Resource(ctx, tn.ident, name, port)
		if err != nil {
			cancel()
			var d *policy.Denied
			if errors.As(err, &d) {
				lastErr = &refusal{pkt, d.Code, d.Reason}
			} else {
				lastErr = &refusal{pkt, tsgu.EProxyInternalError, err.Error()}
			}
			continue
		}
		dialed := time.Now()
		conn, err := s.deps.Dial(ctx, "tcp", tg.Addr.String())
		tn.dial = time.Since(dialed)
		cancel()
		if err != nil {
			lastErr = &refusal{pkt, tsgu.EProxyTSConnectFailed, fmt.Sprintf("dial %s (%s): %v", name, tg.Addr, err)}
			continue
		}
		if !tn.setHost(conn) {
			return net.ErrClosed
		}
		for _, c := range tn.hs.conns {
			if !c.authorize() {
				return &refusal{pkt, tsgu.EProxySessionTimeout, fmt.Sprintf("no channel open within the handshake budget of %s", s.cfg.HandshakeTimeout.D())}
			}
		}
		if tn.hs.onOpen != nil {
			tn.hs.onOpen()
		}
		tn.target = tg
		tn.upstream = conn
		return nil
	}
	if lastErr == nil {
		return &refusal{pkt, tsgu.EProxyRAPAccessDenied, "no resource named"}
	}
	return lastErr
}

// ms is d in milliseconds to the microsecond, for log lines.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
