// Package broker is the session broker: it authenticates a launch, checks
// entitlement, places it on the least-loaded healthy host of the delivery
// group (or the user's existing session) and answers with an .rdp file that
// reaches that host through the gateway with a signed token. Agents on the
// session hosts register with join tokens and report load, health and
// sessions.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
)

// dbTimeout bounds one database call made for a request (a placement
// attempt, a heartbeat, an admin's query); past it, or on any failure
// with the database not answering a ping (2 s), the broker answers from
// its local host cache. With the ping it keeps a launch well inside the
// 10 s a portal or client waits: a link cut without a reset refuses
// nothing, and the launch would otherwise wait for the client to give up
// and try another broker while this one still holds it.
const dbTimeout = 3 * time.Second

// refreshTimeout bounds a reload of the local host cache, which would
// otherwise wait on a cut link until it returns, holding the lock that
// puts entitlements in force.
const refreshTimeout = 30 * time.Second

// cacheRefresh is how often the local host cache is reloaded from the
// database, and how often an unreachable database is tried again.
const cacheRefresh = 5 * time.Second

// sessionRefreshTicks is how many refreshes pass between full reloads of
// the live sessions into the local host cache.
const sessionRefreshTicks = 12

// Deps are what the broker needs from outside.
type Deps struct {
	Logger   *slog.Logger
	Registry prometheus.Registerer
	Users    *auth.Users
	Tokens   *auth.Tokens
	Store    *store.Store
	// Throttle locks out users and addresses after repeated bad passwords.
	Throttle *auth.Throttle
	Now      func() time.Time
	// StateDir holds the local host cache's journal of launches placed
	// while the database was unreachable.
	StateDir string
	// PeerTLS is how the peer brokers' certificates are checked
	// (broker.peer_ca, broker.peer_server_name); nil means the system
	// roots, for each peer URL's host.
	PeerTLS *tls.Config
}

// Server is the broker role.
type Server struct {
	cfg      *config.Broker
	log      *slog.Logger
	users    *auth.Users
	tokens   *auth.Tokens
	store    *store.Store
	throttle *auth.Throttle
	now      func() time.Time
	groups   atomic.Pointer[groupSet] // rebuilt whole by setGroups
	// groupsMu orders rebuilds of groups from the configured delivery
	// groups and the entitlements administrators set, which it guards.
	groupsMu   sync.Mutex
	configured []config.DeliveryGrp
	// space is what the broker knows of its state directory's disk.
	space    diskSpace
	entitled []store.Entitlement
	frontend [][]byte
	sem      chan struct{}
	m        *metrics
	cache    *localCache
	// peers are the other brokers on the database (broker.peers), as
	// a reload leaves them.
	peers atomic.Pointer[peerSet]
	// settleBy is when (Unix ms) a peer that does not answer stops being
	// waited for (settleUser); settleMax is how long after the database
	// returns that is (peerSettleMax).
	settleBy  atomic.Int64
	settleMax time.Duration
	offline   atomic.Bool
	// unsynced is set while the database has not been migrated and given
	// the delivery groups since the broker started (it was down then).
	unsynced atomic.Bool
}

// groupSet is the delivery groups in force, with their entitlements. It
// is never changed: a reload or a new entitlement builds another.
type groupSet struct {
	list     []config.DeliveryGrp
	byName   map[string]*config.DeliveryGrp
	personal map[string]bool
	// set holds, by group, the entitlement an administrator set, which
	// replaced the configured users and groups of list's entry;
	// configured keeps those.
	set        map[string]store.Entitlement
	configured map[string]config.DeliveryGrp
}

func newGroupSet(groups []config.DeliveryGrp, entitled []store.Entitlement) *groupSet {
	gs := &groupSet{list: slices.Clone(groups), byName: map[string]*config.DeliveryGrp{}, personal: map[string]bool{},
		set: map[string]store.Entitlement{}, configured: map[string]config.DeliveryGrp{}}
	for i := range gs.list {
		g := &gs.list[i]
		gs.configured[g.Name] = *g
		if j := slices.IndexFunc(entitled, func(e store.Entitlement) bool { return e.Group == g.Name }); j >= 0 {
			e := entitled[j]
			g.Users, g.Groups = slices.Clone(e.Users), slices.Clone(e.Groups)
			gs.set[g.Name] = e
		}
		gs.byName[g.Name] = g
		gs.personal[g.Name] = g.Kind == "personal"
	}
	return gs
}

// New builds the broker; Start syncs its delivery groups into the store.
func New(cfg *config.Broker, d Deps) (*Server, error) {
	if d.Tokens == nil {
		return nil, errors.New("broker: auth.token_key is required to sign gateway tokens")
	}
	if d.Store == nil || d.Users == nil || d.Logger == nil || d.StateDir == "" {
		return nil, errors.New("broker: store, users, logger and state dir are required")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Throttle == nil {
		d.Throttle = auth.NewThrottle(5, 20, 5*time.Minute, d.Now)
	}
	s := &Server{cfg: cfg, log: d.Logger, users: d.Users, tokens: d.Tokens, store: d.Store, throttle: d.Throttle,
		now: d.Now, m: newMetrics(d.Registry), space: diskSpace{dir: d.StateDir}, settleMax: peerSettleMax}
	s.cache = newLocalCache(filepath.Join(d.StateDir, "broker-offline.journal"), filepath.Join(d.StateDir, "broker-cache.json"), &s.offline)
	s.peers.Store(newPeerSet(cfg, d.PeerTLS))
	logPeers(s.log, s.peers.Load())
	s.configured = cfg.DeliveryGroups
	s.groups.Store(newGroupSet(cfg.DeliveryGroups, nil))
	for _, t := range cfg.FrontendTokens {
		s.frontend = append(s.frontend, []byte(t.Value()))
	}
	if cfg.MaxConcurrentLaunches > 0 {
		s.sem = make(chan struct{}, cfg.MaxConcurrentLaunches)
	}
	return s, nil
}

// Start migrates the database, writes the configured delivery groups into
// it, writes back launches a previous run placed while the database was
// unreachable, and loads the local host cache. When the database does not
// answer, the broker starts from the copy of the cache it saved, placing
// launches from it until the database returns; Maintain then does the rest.
func (s *Server) Start(ctx context.Context) error {
	err := s.sync(ctx)
	if err == nil {
		s.settleAll()
		return s.refresh(ctx, true)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	perr := s.store.Ping(pctx)
	cancel()
	if perr == nil {
		return err // the database answers: a real failure
	}
	snap, serr := s.cache.restoreSnapshot()
	if serr != nil {
		return fmt.Errorf("%w (and no saved local host cache to start from: %v)", err, serr)
	}
	// Entitlements administrators set stay in force: a user whose desktop
	// was taken away must not get it back from a restart in an outage.
	s.setEntitlements(snap.Entitlements)
	replayed, rerr := s.cache.replay()
	if rerr != nil {
		return fmt.Errorf("%w (and the journal of offline launches cannot be read: %v)", err, rerr)
	}
	s.unsynced.Store(true)
	s.offline.Store(true)
	s.m.offline.Set(1)
	s.log.Warn("database unreachable at start: placing launches from the local host cache saved before, until it returns; migrations and delivery groups are applied then",
		"saved", snap.Saved, "hosts", len(snap.Hosts), "live_sessions", len(snap.Sessions), "offline_launches", replayed, "error", err)
	return nil
}

// sync migrates the database, writes the delivery groups into it and
// writes back journals of offline launches.
func (s *Server) sync(ctx context.Context) error {
	if err := s.store.Migrate(ctx); err != nil {
		return err
	}
	if err := s.syncGroups(ctx, s.groups.Load()); err != nil {
		return err
	}
	return s.restore(ctx)
}

// syncGroups writes the delivery groups of gs into the database.
func (s *Server) syncGroups(ctx context.Context, gs *groupSet) error {
	var groups []store.Group
	for _, g := range gs.list {
		groups = append(groups, store.Group{Name: g.Name, Kind: g.Kind, Spread: g.Spread, Description: g.Description})
	}
	return s.store.SyncGroups(ctx, groups)
}

// Reload puts new users and delivery groups (their entitlements, kinds
// and limits) in force, from a configuration that has been validated:
// launches from now on see them; sessions already placed stay where they
// are. The groups are written into the database first; while it is away
// they are written when it returns.
func (s *Server) Reload(ctx context.Context, cfg *config.Broker, users *auth.Users) error {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	gs := newGroupSet(cfg.DeliveryGroups, s.entitled)
	if err := s.syncGroups(ctx, gs); err != nil {
		if ctx.Err() != nil || !s.dbDown(err) {
			return fmt.Errorf("broker: reload: writing the delivery groups: %w", err)
		}
		s.unsynced.Store(true)
	}
	s.configured = cfg.DeliveryGroups
	s.groups.Store(gs)
	s.users.Replace(users)
	s.log.Info("users and delivery groups reloaded", "delivery_groups", len(gs.list))
	return nil
}

// refresh reloads the local host cache from the database: the hosts
// every time, the live sessions when sessions is set (they change through
// this broker's own launches and events in between, and are many).
func (s *Server) refresh(ctx context.Context, sessions bool) error {
	r, err := s.readForCache(ctx, sessions)
	if err != nil {
		return err
	}
	s.applyCacheRead(r)
	return nil
}

// cacheRead is what a refresh read from the database, and the copy's
// change count before it began.
type cacheRead struct {
	mark     uint64
	hosts    []store.Host
	live     []store.Session
	sessions bool
}

// readForCache is refresh's reading half.
func (s *Server) readForCache(ctx context.Context, sessions bool) (cacheRead, error) {
	r := cacheRead{mark: s.cache.mark(), sessions: sessions}
	var err error
	if r.hosts, err = s.store.Hosts(ctx, ""); err != nil {
		return r, err
	}
	if err := s.loadEntitlements(ctx); err != nil {
		return r, err
	}
	if sessions {
		if r.live, err = s.store.Sessions(ctx, "", false, 1<<30); err != nil {
			return r, err
		}
	}
	return r, nil
}

// applyCacheRead is refresh's other half: the copy takes what was read,
// but for what this broker changed since, and is saved.
func (s *Server) applyCacheRead(r cacheRead) {
	if !s.offline.Load() {
		s.cache.loadSince(r.mark, r.hosts, r.live, r.sessions)
	}
	if err := s.cache.save(s.now()); err != nil {
		s.log.Warn("could not save the local host cache; a restart while the database is down would have none", "error", err)
	}
}

// restore writes what the journal of the outage holds back to the
// database, journal by journal, in the order it happened: the sessions
// placed from the local host cache (consecutive ones in one transaction)
// and the agents' events and reports between them. Each step can be
// written twice (a write-back cut short is done again from the start):
// stored sessions are skipped, and an event or report changes nothing
// the second time.
func (s *Server) restore(ctx context.Context) error {
	for {
		path, err := s.cache.claim()
		if err != nil || path == "" {
			return err
		}
		entries, err := readJournal(path)
		if err != nil {
			return err
		}
		var launches []store.Session
		placed, live, events, reports, drains := 0, 0, 0, 0, 0
		flush := func() error {
			if len(launches) == 0 {
				return nil
			}
			var n int
			err := retryConflict(ctx, func() (err error) { n, err = s.store.Restore(ctx, launches, s.groups.Load().personal); return err })
			if err != nil {
				return fmt.Errorf("broker: writing back launches placed while the database was unreachable: %w", err)
			}
			placed, live, launches = placed+len(launches), live+n, nil
			return nil
		}
		// Placements given up on go first: a late one stored for a user
		// would otherwise pass for the user's session when the journal's
		// own is written back, and that one be stored as ended.
		var voids []string
		for _, e := range entries {
			if e.Void != "" {
				voids = append(voids, e.Void)
			}
		}
		voided := 0
		if len(voids) > 0 {
			if err = retryConflict(ctx, func() (err error) { voided, err = s.store.Void(ctx, voids); return err }); err != nil {
				return fmt.Errorf("broker: deleting placements given up on while the database was unreachable: %w", err)
			}
		}
		for _, e := range entries {
			if e.Void != "" {
				continue
			}
			if e.Event == nil && e.Report == nil && e.Drain == nil {
				launches = append(launches, e.Session)
				continue
			}
			if err := flush(); err != nil {
				return err
			}
			var host string
			switch {
			case e.Event != nil:
				host, events = e.Event.Host, events+1
				err = retryConflict(ctx, func() error { _, err := s.store.Event(ctx, *e.Event); return err })
			case e.Report != nil:
				host, reports = e.Report.Host, reports+1
				err = retryConflict(ctx, func() error { return s.store.Heartbeat(ctx, *e.Report) })
			default:
				host, drains = e.Drain.Host, drains+1
				err = retryConflict(ctx, func() error { return s.store.SetAdminDrain(ctx, e.Drain.Host, e.Drain.Drain) })
			}
			if errors.Is(err, store.ErrNotFound) {
				// The host was removed (and perhaps joined again) since.
				s.log.Warn("a report or drain from the outage is for a host no longer registered; skipped", "host", host)
				continue
			}
			if err != nil {
				return fmt.Errorf("broker: writing back session events of the outage: %w", err)
			}
		}
		if err := flush(); err != nil {
			return err
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		s.log.Info("what happened while the database was unreachable is written back", "sessions", placed, "live", live, "events", events, "reports", reports, "drains", drains, "late_placements_deleted", voided)
	}
}

// retryConflict runs one step of a write-back again when PostgreSQL
// ended it for a deadlock or a serialization failure. Several brokers
// write their journals back at once, and their steps lock the same hosts
// and sessions in different orders; a step that lost was rolled back
// whole, and run again it changes what it would have. Failing the
// write-back there would start it over from the top at the next tick,
// every step of a long journal again (15 to 20 s a time in the bench on
// a busy machine), placing from the cache all the while.
func retryConflict(ctx context.Context, step func() error) error {
	const tries = 5
	for i := 1; ; i++ {
		err := step()
		if err == nil || i == tries || !store.Conflict(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(i) * 50 * time.Millisecond):
		}
	}
}

// Maintain keeps the local host cache fresh and, while the database is
// unreachable, tries it again and writes the journal back when it answers.
// Serve runs it; it returns when ctx ends.
func (s *Server) Maintain(ctx context.Context) {
	t := time.NewTicker(cacheRefresh)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.offline.Load() {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := s.store.Ping(pctx)
			cancel()
			if err != nil {
				// Still down: keep the saved copy as current as the one in
				// memory, for a restart before the database returns.
				if err := s.cache.save(s.now()); err != nil {
					s.log.Warn("could not save the local host cache", "error", err)
				}
				continue
			}
		}
		if s.unsynced.Load() {
			if err := s.sync(ctx); err != nil {
				s.log.Warn("database answers, but migrating it or writing the delivery groups and offline launches failed; retrying", "error", err)
				continue
			}
			s.unsynced.Store(false)
		} else if err := s.restore(ctx); err != nil {
			s.log.Warn("write-back of offline launches failed; retrying", "error", err)
			continue
		}
		if s.offline.Load() {
			s.waitForPeers()
		}
		recovered, err := s.cache.goOnline()
		if err != nil {
			continue // journaled meanwhile: written back on the next tick
		}
		if recovered {
			s.m.offline.Set(0)
			s.log.Info("database reachable again: placing launches in the database")
		}
		rctx, cancel := context.WithTimeout(ctx, refreshTimeout)
		err = s.refresh(rctx, recovered || tick%sessionRefreshTicks == 0)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("local host cache refresh failed", "error", err)
		}
		if tick%commandPruneTicks == 0 {
			if n, err := s.store.PruneCommands(ctx, s.now().Add(-commandRetention)); err != nil {
				s.log.Warn("pruning old session commands failed", "error", err)
			} else if n > 0 {
				s.log.Info("pruned old session commands", "count", n)
			}
		}
	}
}

// Session commands are kept a week (the audit table keeps who sent them
// for good), pruned once an hour.
const (
	commandRetention  = 7 * 24 * time.Hour
	commandPruneTicks = int(time.Hour / cacheRefresh)
)

type metrics struct {
	busyWaits  prometheus.Counter
	offline    prometheus.Gauge
	launches   *prometheus.CounterVec
	latency    prometheus.Histogram
	inflight   prometheus.Gauge
	heartbeats prometheus.Counter
	// peerQueries counts questions to peer brokers in an outage.
	peerQueries *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		launches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_broker_launches_total",
			Help: "Launch requests by result: placed, reconnected (with _offline when placed from the local host cache), no_host, throttled, denied, bad_request, error."}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "deskway_broker_launch_seconds",
			Help: "Time to place a launch, database round trips included.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "deskway_broker_launches_in_flight",
			Help: "Launches being placed now."}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{Name: "deskway_broker_heartbeats_total",
			Help: "Agent heartbeats accepted."}),
		busyWaits: prometheus.NewCounter(prometheus.CounterOpts{Name: "deskway_broker_busy_waits_total",
			Help: "Times a launch waited inside the broker for a host busy with logons (broker.busy_wait)."}),
		peerQueries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_broker_peer_questions_total",
			Help: "Questions to peer brokers about a user, in a database outage (a user this broker holds no session of) or, back on the database, to a peer that has not said it has written back what it placed in the outage, by answer: found (the launch reconnects to it), none, unreachable (no answer within broker.peer_timeout), refused."}, []string{"result"}),
		offline: prometheus.NewGauge(prometheus.GaugeOpts{Name: "deskway_broker_database_unreachable",
			Help: "1 while launches are placed from the local host cache because the database does not answer."}),
	}
	// Each result is a series at 0 from the start, so that an alert on
	// rate(...{result="no_host"}) sees the first refusal.
	for _, r := range []string{"placed", "reconnected", "placed_offline", "reconnected_offline", "no_host", "throttled", "denied", "bad_request", "error"} {
		m.launches.WithLabelValues(r)
	}
	for _, r := range []string{"found", "none", "unreachable", "refused"} {
		m.peerQueries.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.launches, m.latency, m.inflight, m.heartbeats, m.offline, m.busyWaits, m.peerQueries)
	}
	return m
}
