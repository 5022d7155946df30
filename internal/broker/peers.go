package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
)

// peerTokenTTL is how long a peer token lives: one question, with room
// for the clocks of two brokers to differ.
const peerTokenTTL = 30 * time.Second

// maxPeerHosts bounds the hosts one peer question asks about: those of
// one user's sessions, one per delivery group.
const maxPeerHosts = 100

// peer is another broker on the same database (broker.peers).
type peer struct {
	client *brokerclient.Client
	// down is set while the peer does not answer, so that its going
	// away and coming back are logged once each, not at every launch.
	down atomic.Bool
	// settle is whether this broker, on the database, asks the peer
	// before placing a user (settleUser): unsettled (the zero value, at
	// start with the database away, and from when this broker loses it
	// or the peer says it is away from it) until the peer says it has
	// written back what it placed meanwhile (settled) or has been silent
	// too long (givenUp).
	settle atomic.Int32
}

// peerSet is broker.peers, broker.peer_timeout and how the peers'
// certificates are checked, as in force: built at start, replaced whole
// by a reload that changes any of them, so that a question in flight
// finishes with the set it began with.
type peerSet struct {
	list    []*peer
	urls    []string
	timeout time.Duration
	tls     *tls.Config
	hc      *http.Client
}

// newPeerSet builds the clients of the brokers in cfg.Peers, trusting tc.
func newPeerSet(cfg *config.Broker, tc *tls.Config) *peerSet {
	ps := &peerSet{urls: slices.Clone(cfg.Peers), timeout: cfg.PeerTimeout.D(), tls: tc}
	if len(cfg.Peers) == 0 {
		return ps
	}
	ps.hc = &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 4}}
	for _, u := range cfg.Peers {
		ps.list = append(ps.list, &peer{client: &brokerclient.Client{Base: u, HTTP: ps.hc}})
	}
	return ps
}

// changes says, in words, how next differs from ps; empty when it does
// not.
func (ps *peerSet) changes(next *peerSet) string {
	var out []string
	if !slices.Equal(ps.urls, next.urls) {
		out = append(out, fmt.Sprintf("broker.peers %s → %s", listed(ps.urls), listed(next.urls)))
	}
	if ps.timeout != next.timeout {
		out = append(out, fmt.Sprintf("broker.peer_timeout %s → %s", ps.timeout, next.timeout))
	}
	// Without peers before or after, how their certificates are
	// checked is moot: the list's change says it all.
	if len(ps.urls) > 0 && len(next.urls) > 0 {
		var name, nextName string
		var roots, nextRoots *x509.CertPool
		if ps.tls != nil {
			name, roots = ps.tls.ServerName, ps.tls.RootCAs
		}
		if next.tls != nil {
			nextName, nextRoots = next.tls.ServerName, next.tls.RootCAs
		}
		if name != nextName {
			out = append(out, fmt.Sprintf("broker.peer_server_name %q → %q", name, nextName))
		}
		if !roots.Equal(nextRoots) {
			out = append(out, "broker.peer_ca holds other certificates")
		}
	}
	return strings.Join(out, "; ")
}

// listed is urls as a reader sees them, none included.
func listed(urls []string) string {
	if len(urls) == 0 {
		return "none"
	}
	return "[" + strings.Join(urls, ", ") + "]"
}

// SetPeers puts broker.peers, broker.peer_timeout and the peers' TLS
// check (tc: broker.peer_ca and broker.peer_server_name, loaded) of a
// validated configuration in force, without a restart: the launches and
// reports that ask the peers from now on ask these. It returns what
// changed, in words, or "" when nothing did.
func (s *Server) SetPeers(cfg *config.Broker, tc *tls.Config) string {
	next := newPeerSet(cfg, tc)
	old := s.peers.Load()
	what := old.changes(next)
	if what == "" {
		return ""
	}
	// A peer kept from the old set keeps whether it has written back
	// (settle); one added is asked at the next launch, and settles at
	// its first answer.
	for _, p := range next.list {
		for _, o := range old.list {
			if o.client.Base == p.client.Base {
				p.settle.Store(o.settle.Load())
			}
		}
	}
	s.peers.Store(next)
	if old.hc != nil {
		// Questions in flight keep their connections; idle ones to
		// peers no longer asked would otherwise stay open.
		old.hc.CloseIdleConnections()
	}
	s.log.Info("peer brokers reloaded: in a database outage, launches and reports ask these from now on", "peers", next.urls,
		"peer_timeout", next.timeout.String(), "changed", what)
	return what
}

// askPeers asks the other brokers, while the database is away, which
// sessions or pending placements of user they hold (none, user empty),
// with their hosts and the hosts named, and takes what the local host
// cache lacks into it, so that the placement that follows sends the user
// back to one rather than placing a second, and a report from a host
// registered through a peer is taken. In an outage the brokers share
// nothing else: a session another broker placed, every report of which
// went to that broker, is in no copy but its own. A peer that does not
// answer within broker.peer_timeout is taken to hold nothing: the launch
// or report goes on, and the silence is counted and logged.
func (s *Server) askPeers(ctx context.Context, user string, hosts []string) {
	tok, err := s.tokens.MintPeer(user, hosts, peerTokenTTL)
	if err != nil {
		s.log.Warn("could not sign a question to the peer brokers; placing without it", "user", user, "error", err)
		return
	}
	ps := s.peers.Load()
	ctx, cancel := context.WithTimeout(ctx, ps.timeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range ps.list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := s.question(ctx, p, tok, brokerapi.PeerQuery{User: user, Hosts: hosts, JournalPending: s.offline.Load()})
			if res == nil {
				return
			}
			s.cache.learnPeer(user, res)
			if len(res.Sessions) == 0 && len(res.Hosts) == 0 {
				s.m.peerQueries.WithLabelValues("none").Inc()
				return
			}
			s.m.peerQueries.WithLabelValues("found").Inc()
			if len(res.Sessions) > 0 {
				s.log.Info("a peer broker holds the user's session: the launch goes back to it", "peer", p.client.Base, "user", user,
					"host", res.Sessions[0].Host, "session", res.Sessions[0].ID)
			}
		}()
	}
	wg.Wait()
}

// question asks one peer about the user and hosts of q with tok, and
// returns its answer, or nil when it gave none within ctx: that is
// counted, and logged once until the peer answers again.
func (s *Server) question(ctx context.Context, p *peer, tok string, q brokerapi.PeerQuery) *brokerapi.PeerSessions {
	res, err := p.client.PeerSessions(ctx, tok, q)
	if err != nil {
		result := "unreachable"
		if se := (*brokerclient.StatusError)(nil); errors.As(err, &se) {
			result = "refused" // a different auth.token_key, most likely
		}
		s.m.peerQueries.WithLabelValues(result).Inc()
		if !p.down.Swap(true) {
			s.log.Warn("a peer broker did not answer whether it holds a user's session; launches go on without it, and a user it placed while the database was away may get a second session here",
				"peer", p.client.Base, "result", result, "error", err)
		}
		return nil
	}
	if p.down.Swap(false) {
		s.log.Info("a peer broker answers again", "peer", p.client.Base)
	}
	return res
}

// peerSessions answers a peer broker's question: the live sessions and
// pending placements of one user in this broker's local host cache. The
// question must carry a peer token, signed with the key the brokers
// share, naming that user: who has sessions where is told to no one else.
func (s *Server) peerSessions(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	if tok == "" {
		s.fail(w, r, http.StatusUnauthorized, "peer questions need Authorization: Bearer <peer token>, which only a broker holding this one's auth.token_key can sign")
		return
	}
	claims, err := s.tokens.VerifyPeer(tok)
	if err != nil {
		s.fail(w, r, http.StatusUnauthorized, "peer token refused (%v): the brokers on one database must share auth.token_key", err)
		return
	}
	var q brokerapi.PeerQuery
	if err := decode(w, r, &q); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if q.User != claims.Subject || !allIn(q.Hosts, claims.Hosts) {
		s.fail(w, r, http.StatusForbidden, "this peer token asks about another user or other hosts")
		return
	}
	if len(q.Hosts) > maxPeerHosts {
		s.fail(w, r, http.StatusBadRequest, "a peer question names at most %d hosts", maxPeerHosts)
		return
	}
	if q.JournalPending {
		s.peerAway()
	}
	// Read before the copy: a broker goes back to the database only with
	// its journal written back, so an answer that says nothing is
	// pending holds nothing the database lacks.
	pending := s.offline.Load()
	res := s.cache.peerView(q.User, q.Hosts)
	res.JournalPending = pending
	writeJSON(w, http.StatusOK, res)
}

// usable reports whether the copy holds a session (or pending
// placement) of user in group that a launch can be sent back to: on a
// host the copy knows and has heard from since stale. Otherwise a peer
// may know more: the session, or its host (returned, to ask about), or a
// later report of the host.
func (c *localCache) usable(user, group string, stale time.Time) (ok bool, host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, held := c.live[liveKey(user, group)]
	if !held {
		return false, ""
	}
	h, known := c.hosts[s.Host]
	if known && !h.LastSeen.Before(stale) {
		return true, ""
	}
	return false, s.Host
}

// peerView is what a peer is told of user: their sessions in the copy,
// and the hosts they are on, with the hosts of the user's sessions the
// peer asked about.
func (c *localCache) peerView(user string, asked []string) brokerapi.PeerSessions {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := brokerapi.PeerSessions{Sessions: []brokerapi.PeerSession{}, Hosts: []brokerapi.PeerHost{}}
	hosts := map[string]bool{}
	for _, ss := range c.live {
		if user == "" || ss.User != user || ss.State == store.Ended {
			continue
		}
		out.Sessions = append(out.Sessions, brokerapi.PeerSession{ID: ss.ID, DeliveryGroup: ss.Group, Host: ss.Host, State: ss.State,
			CreatedAt: ss.CreatedAt, UpdatedAt: ss.UpdatedAt})
		hosts[ss.Host] = true
	}
	for _, h := range asked {
		hosts[h] = true
	}
	for name := range hosts {
		if h, ok := c.hosts[name]; ok {
			out.Hosts = append(out.Hosts, peerHost(h))
		}
	}
	return out
}

// learnPeer takes into the copy what a peer holds of user that the copy
// lacks: hosts it does not know (registered through the peer since the
// copy's last reload), a later report of a host it knows (the host's
// reports may all have gone to the peer: the user's session on it must
// still draw the launch), and the user's sessions on hosts it now knows.
func (c *localCache) learnPeer(user string, res *brokerapi.PeerSessions) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ph := range res.Hosts {
		h, ok := c.hosts[ph.Name]
		switch {
		case !ok:
			c.hosts[ph.Name] = fromPeerHost(ph)
		case h.Registration == ph.Registration && ph.LastSeen.After(h.LastSeen):
			h.LastSeen = ph.LastSeen
			c.hosts[ph.Name] = h
		}
	}
	for _, p := range res.Sessions {
		h, ok := c.hosts[p.Host]
		if !ok || h.Group != p.DeliveryGroup || p.State == store.Ended {
			continue
		}
		k := liveKey(user, p.DeliveryGroup)
		if _, held := c.live[k]; held {
			continue
		}
		c.live[k] = store.Session{ID: p.ID, User: user, Group: p.DeliveryGroup, Host: p.Host, State: p.State,
			CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
	}
}

func peerHost(h store.Host) brokerapi.PeerHost {
	return brokerapi.PeerHost{Name: h.Name, DeliveryGroup: h.Group, Zone: h.Zone, Address: h.Address, Port: h.Port,
		Weight: h.Weight, SessionLimit: h.SessionLimit, LogonLimit: h.LogonLimit, Sessions: h.Sessions, Pending: h.Pending,
		CPU: h.CPU, Mem: h.Mem, DiskIdle: h.DiskIdle, DiskLatency: h.DiskLatency, MemPressure: h.MemPressure,
		CPUPressure: h.CPUPressure, Unhealthy: h.Unhealthy, AdminDrain: h.AdminDrain, AgentDrain: h.AgentDrain,
		AssignedUser: h.AssignedUser, Registration: h.Registration, RegisteredAt: h.RegisteredAt, LastSeen: h.LastSeen}
}

func fromPeerHost(h brokerapi.PeerHost) store.Host {
	return store.Host{Name: h.Name, Group: h.DeliveryGroup, Zone: h.Zone, Address: h.Address, Port: h.Port,
		Weight: h.Weight, SessionLimit: h.SessionLimit, LogonLimit: h.LogonLimit, Sessions: h.Sessions, Pending: h.Pending,
		CPU: h.CPU, Mem: h.Mem, DiskIdle: h.DiskIdle, DiskLatency: h.DiskLatency, MemPressure: h.MemPressure,
		CPUPressure: h.CPUPressure, Unhealthy: h.Unhealthy, AdminDrain: h.AdminDrain, AgentDrain: h.AgentDrain,
		AssignedUser: h.AssignedUser, Registration: h.Registration, RegisteredAt: h.RegisteredAt, LastSeen: h.LastSeen}
}

// unknownHost answers a report from a host this broker's copy does not
// hold while the database is away: 503, to be sent again, and not 404,
// which would have the agent give up its credential and register with
// its join token, which the database cannot take now either.
func (s *Server) unknownHost(w http.ResponseWriter, r *http.Request, host string) {
	w.Header().Set("Retry-After", "5")
	s.fail(w, r, http.StatusServiceUnavailable, "the database is unreachable and this broker does not hold host %q yet (it registered through another broker): report again", host)
}

// allIn reports whether every one of want is in have.
func allIn(want, have []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// logPeers says at start which peers a launch in an outage asks.
func logPeers(log *slog.Logger, ps *peerSet) {
	if len(ps.urls) == 0 {
		return
	}
	log.Info("peer brokers: in a database outage, a launch for a user this broker holds no session of asks them first", "peers", ps.urls)
}
