// Package broker is the session broker: it authenticates a launch, checks
// entitlement, places it on the least-loaded healthy host of the delivery
// group (or the user's existing session) and answers with an .rdp file that
// reaches that host through the gateway with a signed token. Agents on the
// session hosts register with join tokens and report load, health and
// sessions.
package broker

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/httpguard"
	"github.com/deskway/deskway/internal/obs"
	"github.com/deskway/deskway/internal/proxylisten"
)

// maxBody bounds every API request body.
const maxBody = 64 << 10

// dbTimeout bounds one placement attempt on the database; past it, or on
// any failure with the database not answering a ping, the broker places
// from its local host cache.
const dbTimeout = 10 * time.Second

// cacheRefresh is how often the local host cache is reloaded from the
// database, and how often an unreachable database is tried again.
const cacheRefresh = 5 * time.Second

// sessionRefreshTicks is how many refreshes pass between full reloads of
// the live sessions into the local host cache.
const sessionRefreshTicks = 12

// AgentCredentialTTL is how long a registered host's credential lasts; an
// agent whose credential expires registers again with its join token.
const AgentCredentialTTL = 7 * 24 * time.Hour

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
	entitled   []store.Entitlement
	frontend   [][]byte
	sem        chan struct{}
	m          *metrics
	cache      *localCache
	offline    atomic.Bool
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
		now: d.Now, m: newMetrics(d.Registry)}
	s.cache = newLocalCache(filepath.Join(d.StateDir, "broker-offline.journal"), filepath.Join(d.StateDir, "broker-cache.json"), &s.offline)
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
	hosts, err := s.store.Hosts(ctx, "")
	if err != nil {
		return err
	}
	if err := s.loadEntitlements(ctx); err != nil {
		return err
	}
	var live []store.Session
	if sessions {
		if live, err = s.store.Sessions(ctx, "", false, 1<<30); err != nil {
			return err
		}
	}
	if !s.offline.Load() {
		s.cache.load(hosts, live, sessions)
	}
	if err := s.cache.save(s.now()); err != nil {
		s.log.Warn("could not save the local host cache; a restart while the database is down would have none", "error", err)
	}
	return nil
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
			n, err := s.store.Restore(ctx, launches, s.groups.Load().personal)
			if err != nil {
				return fmt.Errorf("broker: writing back launches placed while the database was unreachable: %w", err)
			}
			placed, live, launches = placed+len(launches), live+n, nil
			return nil
		}
		for _, e := range entries {
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
				_, err = s.store.Event(ctx, *e.Event)
			case e.Report != nil:
				host, reports = e.Report.Host, reports+1
				err = s.store.Heartbeat(ctx, *e.Report)
			default:
				host, drains = e.Drain.Host, drains+1
				err = s.store.SetAdminDrain(ctx, e.Drain.Host, e.Drain.Drain)
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
		s.log.Info("what happened while the database was unreachable is written back", "sessions", placed, "live", live, "events", events, "reports", reports, "drains", drains)
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
		recovered, err := s.cache.goOnline()
		if err != nil {
			continue // journaled meanwhile: written back on the next tick
		}
		if recovered {
			s.m.offline.Set(0)
			s.log.Info("database reachable again: placing launches in the database")
		}
		if err := s.refresh(ctx, recovered || tick%sessionRefreshTicks == 0); err != nil && ctx.Err() == nil {
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

// dbDown reports whether the database is unreachable after cause, and if
// so switches to placing from the local host cache.
func (s *Server) dbDown(cause error) bool {
	if s.offline.Load() {
		return true
	}
	pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if s.store.Ping(pctx) == nil {
		return false
	}
	if !s.offline.Swap(true) {
		s.m.offline.Set(1)
		s.log.Warn("database unreachable: placing launches from the local host cache until it returns", "error", cause)
	}
	return true
}

// place asks the database, or the local host cache when the database is
// unreachable; offline says which answered.
func (s *Server) place(ctx context.Context, l store.Launch) (p store.Placement, offline bool, err error) {
	if !s.offline.Load() {
		dctx, cancel := context.WithTimeout(ctx, dbTimeout)
		p, err = s.store.Place(dctx, l)
		cancel()
		if err == nil {
			s.cache.placed(l, p)
			return p, false, nil
		}
		if errors.Is(err, store.ErrNoHost) || ctx.Err() != nil || !s.dbDown(err) {
			return p, false, err
		}
	}
	p, err = s.cache.place(l)
	if errors.Is(err, errBackOnline) {
		return s.place(ctx, l)
	}
	return p, true, err
}

// Handler serves the launch and agent API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/launch", s.launch)
	mux.HandleFunc("POST /api/v1/desktops", s.desktops)
	mux.HandleFunc("POST /api/v1/sessions/{id}/logoff", s.userLogoff)
	mux.HandleFunc("POST /api/v1/sessions/{id}/end", s.userSessionEnd)
	mux.HandleFunc("POST /api/v1/agent/register", s.register)
	mux.HandleFunc("POST /api/v1/agent/heartbeat", s.heartbeat)
	mux.HandleFunc("POST /api/v1/agent/events", s.events)
	mux.HandleFunc("POST /api/v1/agent/commands/{id}", s.commandResult)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, http.StatusNotFound, "no such broker API path %s %s (see docs/broker-openapi.yaml)", r.Method, r.URL.Path)
	})
	return mux
}

// Guarded is Handler behind the guard every HTTPS request passes
// (bounded bodies, no cross-site state changes): what Serve serves, and
// what a portal in the same process calls without a socket.
func (s *Server) Guarded() http.Handler { return httpguard.Wrap(s.Handler(), maxBody) }

// Serve runs the broker's HTTPS listener until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener, tc *tls.Config) error {
	srv := &http.Server{Handler: s.Guarded(), ReadTimeout: s.cfg.ReadTimeout.D(),
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	go s.Maintain(mctx)
	if len(s.cfg.ProxyProtocolFrom) > 0 {
		trusted, err := config.ParsePrefixes(s.cfg.ProxyProtocolFrom)
		if err != nil {
			return fmt.Errorf("broker: proxy_protocol_from: %w", err)
		}
		ln = proxylisten.New(ln, trusted, s.cfg.ReadTimeout.D(), s.log)
	}
	s.log.Info("broker listening", "addr", ln.Addr().String(), "database", s.store.Dialect(), "zone", s.cfg.Zone)
	return obs.ServeHTTPS(ctx, "broker", srv, ln, tc, 10*time.Second)
}

// fail answers with a JSON error and logs it.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	s.log.Log(r.Context(), refusalLevel(status), "request refused", "method", r.Method, "path", r.URL.Path, "status", status,
		"remote", r.RemoteAddr, "error", msg)
	writeJSON(w, status, brokerapi.Error{Error: msg})
}

// refusalLevel is how loud a refusal with status is logged: an error
// only when the broker itself failed, not when a client was turned away
// or the database is out (503, which its own log lines report).
func refusalLevel(status int) slog.Level {
	if status >= 500 && status != http.StatusServiceUnavailable {
		return slog.LevelError
	}
	return slog.LevelInfo
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decode reads one JSON object into v: at most maxBody bytes, no unknown
// fields, nothing after it.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("request body is over %d bytes", maxBody)
		}
		return fmt.Errorf("request body is not the expected JSON: %v", err)
	}
	if dec.More() {
		return errors.New("request body has data after the JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("request body has data after the JSON object")
	}
	return nil
}

// bearer returns the bearer token of r, or "".
func bearer(r *http.Request) string {
	t, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if t == r.Header.Get("Authorization") {
		return ""
	}
	return t
}

// caller is who is launching.
type caller struct {
	user     string
	groups   []string
	zone     string
	frontend bool
}

// authenticate accepts HTTP Basic with a local user's password, or a
// front-end bearer token.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (caller, bool) {
	ap, _ := netip.ParseAddrPort(r.RemoteAddr)
	from := ap.Addr()
	if tok := bearer(r); tok != "" {
		// Front-end tokens are strings an operator chose, so guessing
		// them counts against the address as wrong passwords do.
		if lk := s.throttle.Check("", from); lk != nil {
			w.Header().Set("Retry-After", strconv.Itoa(int(lk.RetryAfter.Seconds())+1))
			s.fail(w, r, http.StatusTooManyRequests, "login refused: %s", lk.Reason)
			return caller{}, false
		}
		for _, f := range s.frontend {
			if subtle.ConstantTimeCompare([]byte(tok), f) == 1 {
				return caller{frontend: true}, true
			}
		}
		s.throttle.Fail("", from)
		s.fail(w, r, http.StatusUnauthorized, "bearer token is not a front-end token of this broker")
		return caller{}, false
	}
	name, pw, ok := r.BasicAuth()
	if !ok {
		w.Header().Set("WWW-Authenticate", `Basic realm="deskway broker", charset="UTF-8"`)
		s.fail(w, r, http.StatusUnauthorized, "authenticate with HTTP Basic (user and password) or a front-end bearer token")
		return caller{}, false
	}
	// Refused before the password is checked, and not counted.
	if lk := s.throttle.Check(name, from); lk != nil {
		w.Header().Set("Retry-After", strconv.Itoa(int(lk.RetryAfter.Seconds())+1))
		s.fail(w, r, http.StatusTooManyRequests, "login refused: %s", lk.Reason)
		return caller{}, false
	}
	u, found := s.users.Lookup(name)
	if !found || !u.CheckPassword(pw) {
		s.throttle.Fail(name, from)
		w.Header().Set("WWW-Authenticate", `Basic realm="deskway broker", charset="UTF-8"`)
		s.fail(w, r, http.StatusUnauthorized, "wrong user name or password")
		return caller{}, false
	}
	s.throttle.Succeed(u.Name, from)
	return caller{user: u.Name, groups: u.Groups, zone: u.Zone}, true
}

// onBehalf settles whom a request is for: a front end names the user (and
// the groups of a user the broker does not know); a user asking for
// themself names nobody.
func (s *Server) onBehalf(who caller, user string, groups []string) (caller, *refusal) {
	switch {
	case who.frontend && user == "":
		return who, refuse(http.StatusBadRequest, "a front end acting on behalf of a user must name the user")
	case who.frontend:
		if u, found := s.users.Lookup(user); found {
			// A local account's groups and zone are the broker's to know.
			who.user, who.groups, who.zone = u.Name, u.Groups, u.Zone
		} else {
			who.user, who.groups = user, groups
		}
	case user != "" || len(groups) > 0:
		return who, refuse(http.StatusBadRequest, "user and groups are for front ends; a user asking for themself leaves them out")
	}
	if !validUser(who.user) {
		return who, refuse(http.StatusBadRequest, "user name %q is empty, too long or has control characters", who.user)
	}
	return who, nil
}

// user settles whom a user's own request is for: the user authenticated,
// or the one a front end names in its DesktopsRequest body.
func (s *Server) user(w http.ResponseWriter, r *http.Request) (caller, bool) {
	who, ok := s.authenticate(w, r)
	if !ok {
		return who, false
	}
	var req brokerapi.DesktopsRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return who, false
	}
	who, rf := s.onBehalf(who, req.User, req.Groups)
	if rf != nil {
		s.refused(w, r, rf)
		return who, false
	}
	return who, true
}

// desktops lists the delivery groups a user may launch, each with the
// user's live session in it, if any: what a portal shows.
func (s *Server) desktops(w http.ResponseWriter, r *http.Request) {
	who, ok := s.user(w, r)
	if !ok {
		return
	}
	out, rf := s.desktopsOf(r.Context(), who)
	if rf != nil {
		s.refused(w, r, rf)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// desktopsOf lists the delivery groups who may launch, with who's live
// session in each.
func (s *Server) desktopsOf(ctx context.Context, who caller) ([]brokerapi.Desktop, *refusal) {
	var live []store.Session
	var used map[string]time.Time
	var err error
	if s.offlineFor(ctx, func() error {
		if live, err = s.store.Sessions(ctx, who.user, false, 100); err != nil {
			return err
		}
		used, err = s.store.LastUsed(ctx, who.user)
		return err
	}) {
		live, used, err = s.cache.sessions(who.user), nil, nil
	}
	if err != nil {
		return nil, refuse(http.StatusServiceUnavailable, "%v", err)
	}
	out := []brokerapi.Desktop{}
	for _, g := range s.groups.Load().list {
		if !entitled(&g, who.user, who.groups) {
			continue
		}
		d := brokerapi.Desktop{DeliveryGroup: g.Name, Kind: g.Kind, Description: g.Description, LastUsed: used[g.Name]}
		for _, ss := range live {
			// Newest first: the session a launch would reconnect to.
			if ss.Group == g.Name && ss.User == who.user && !ss.Unverified {
				d.Session = &brokerapi.UserSession{ID: ss.ID, Host: ss.Host, State: ss.State, Since: ss.UpdatedAt}
				break
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// userLogoff is a user (or a front end on their behalf) logging their
// own session off: the same command an administrator's logoff queues.
func (s *Server) userLogoff(w http.ResponseWriter, r *http.Request) {
	who, ok := s.user(w, r)
	if !ok {
		return
	}
	st, rf := s.logoffOwn(r.Context(), who, r.PathValue("id"))
	if rf != nil {
		s.refused(w, r, rf)
		return
	}
	writeJSON(w, http.StatusAccepted, st)
}

// logoffOwn queues the logoff of who's own live session id.
func (s *Server) logoffOwn(ctx context.Context, who caller, id string) (brokerapi.CommandStatus, *refusal) {
	var mine bool
	var c store.Command
	var err error
	if s.offlineFor(ctx, func() error {
		var live []store.Session
		if live, err = s.store.Sessions(ctx, who.user, false, 100); err != nil {
			return err
		}
		mine = slices.ContainsFunc(live, func(ss store.Session) bool { return ss.ID == id && ss.User == who.user })
		if !mine {
			return nil
		}
		c, err = s.store.QueueCommand(ctx, id, brokerapi.Logoff, "", s.now())
		return err
	}) {
		return brokerapi.CommandStatus{}, refuse(http.StatusServiceUnavailable, "logging off needs the broker's database, which is unreachable: try again in a moment")
	}
	switch {
	case err == nil && !mine, errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrSessionEnded):
		// Another user's session and no session read the same.
		return brokerapi.CommandStatus{}, refuse(http.StatusNotFound, "you have no live session %q", id)
	case err != nil:
		return brokerapi.CommandStatus{}, refuse(http.StatusServiceUnavailable, "%v", err)
	}
	s.log.Info("user logoff queued", "command", c.ID, "session", id, "user", who.user, "host", c.Host)
	return commandStatus(c), nil
}

// entitled reports whether the user or one of their groups may launch g.
func entitled(g *config.DeliveryGrp, user string, groups []string) bool {
	for _, u := range g.Users {
		if strings.EqualFold(u, user) {
			return true
		}
	}
	for _, want := range g.Groups {
		if slices.ContainsFunc(groups, func(have string) bool { return strings.EqualFold(have, want) }) {
			return true
		}
	}
	return false
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// validUser keeps user names that fit a line of an .rdp file and a token.
func validUser(u string) bool {
	if u == "" || len(u) > 256 {
		return false
	}
	for _, c := range u {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

func (s *Server) launch(w http.ResponseWriter, r *http.Request) {
	start := s.now()
	who, ok := s.authenticate(w, r)
	if !ok {
		s.m.launches.WithLabelValues("denied").Inc()
		return
	}
	var req brokerapi.LaunchRequest
	if err := decode(w, r, &req); err != nil {
		s.m.launches.WithLabelValues("bad_request").Inc()
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	resp, rf := s.launchFor(r.Context(), start, who, req)
	if rf != nil {
		s.refused(w, r, rf)
		return
	}
	if strings.Contains(r.Header.Get("Accept"), "application/x-rdp") {
		w.Header().Set("Content-Type", "application/x-rdp")
		w.Header().Set("Content-Disposition", `attachment; filename="`+req.DeliveryGroup+`.rdp"`)
		_, _ = io.WriteString(w, resp.RDP)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// launchFor places a launch by who (a user, or a front end naming one in
// req) that began at start, and mints its token.
func (s *Server) launchFor(ctx context.Context, start time.Time, who caller, req brokerapi.LaunchRequest) (*brokerapi.LaunchResponse, *refusal) {
	who, rf := s.onBehalf(who, req.User, req.Groups)
	if rf != nil {
		s.m.launches.WithLabelValues("bad_request").Inc()
		return nil, rf
	}
	g, found := s.groups.Load().byName[req.DeliveryGroup]
	if !found {
		s.m.launches.WithLabelValues("bad_request").Inc()
		return nil, refuse(http.StatusNotFound, "no delivery group named %q", req.DeliveryGroup)
	}
	if !entitled(g, who.user, who.groups) {
		s.m.launches.WithLabelValues("denied").Inc()
		return nil, refuse(http.StatusForbidden, "user %s is not entitled to delivery group %q: an administrator adds the user or one of their groups to it", who.user, g.Name)
	}
	retryAfter := max(time.Second, s.cfg.RetryAfter.D().Round(time.Second))
	if s.sem != nil {
		select {
		case s.sem <- struct{}{}:
			defer func() { <-s.sem }()
		default:
			s.m.launches.WithLabelValues("throttled").Inc()
			rf := refuse(http.StatusServiceUnavailable, "broker busy: %d launches in progress (broker.max_concurrent_launches); retry", cap(s.sem))
			rf.retryAfter = retryAfter
			return nil, rf
		}
	}
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	zone := who.zone
	if zone == "" {
		zone = req.Zone
	}
	if zone == "" {
		zone = s.cfg.Zone
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LaunchTimeout.D())
	defer cancel()
	now := s.now()
	stale := now.Add(-s.cfg.HeartbeatTimeout.D())
	l := store.Launch{User: who.user, Group: g.Name, Zone: zone, Personal: g.Kind == "personal",
		Depth: g.Spread == "depth", SessionID: store.NewID(), Now: now, Stale: stale}
	p, offline, err := s.place(ctx, l)
	// Hosts busy with logons free up within moments as users arrive: wait
	// here a little, trying again, rather than send the client away for
	// a whole Retry-After second.
	for wait, waited := 20*time.Millisecond, time.Duration(0); errors.Is(err, store.ErrNoHost); wait = min(2*wait, 320*time.Millisecond) {
		// The cache, current with this broker's own launches and events,
		// tells whether waiting may help without another database trip.
		msg, busy := Explain(g.Name, s.cache.snapshot(g.Name), stale, g.Kind == "personal", who.user)
		if !busy || waited+wait > s.cfg.BusyWait.D() {
			if !offline {
				hosts, herr := s.store.Hosts(ctx, g.Name)
				if herr != nil {
					s.m.launches.WithLabelValues("no_host").Inc()
					return nil, refuse(http.StatusServiceUnavailable, "no host of delivery group %q can take a launch (and listing its hosts failed: %v)", g.Name, herr)
				}
				msg, busy = Explain(g.Name, hosts, stale, g.Kind == "personal", who.user)
			}
			s.m.launches.WithLabelValues("no_host").Inc()
			rf := refuse(http.StatusServiceUnavailable, "%s", msg)
			if busy {
				rf.retryAfter = retryAfter
			}
			return nil, rf
		}
		s.m.busyWaits.Inc()
		select {
		case <-ctx.Done():
			s.m.launches.WithLabelValues("error").Inc()
			return nil, refuse(http.StatusServiceUnavailable, "launch timed out waiting for a host: %s", msg)
		case <-time.After(wait):
		}
		waited += wait
		l.Now = s.now()
		p, offline, err = s.place(ctx, l)
	}
	if err != nil {
		s.m.launches.WithLabelValues("error").Inc()
		return nil, refuse(http.StatusServiceUnavailable, "placement failed: %v", err)
	}
	tok, err := s.tokens.Mint(who.user, who.groups, p.Address, p.Port, s.cfg.TokenTTL.D())
	if err != nil {
		s.m.launches.WithLabelValues("error").Inc()
		return nil, refuse(http.StatusInternalServerError, "%v", err)
	}
	result := "placed"
	if p.Reconnect {
		result = "reconnected"
	}
	if offline {
		result += "_offline"
	}
	s.m.launches.WithLabelValues(result).Inc()
	s.m.latency.Observe(s.now().Sub(start).Seconds())
	s.log.Info("launch", "user", who.user, "delivery_group", g.Name, "host", p.Host, "session", p.SessionID,
		"reconnect", p.Reconnect, "zone", zone, "offline", offline, "ms", s.now().Sub(start).Milliseconds())
	hostUser := who.user
	if g.HostUsername == "none" {
		hostUser = ""
	}
	// A user with a desktop account logs on as it: the gateway puts its
	// password in a browser session's logon, and the .rdp file names it.
	d, sso := s.users.Desktop(who.user)
	if sso {
		hostUser = d.Account
	}
	return &brokerapi.LaunchResponse{SessionID: p.SessionID, Host: p.Host, Address: p.Address, Port: p.Port,
		Reconnect: p.Reconnect, Gateway: s.cfg.Gateway, Token: tok, SingleSignOn: sso,
		RDP: RDPFile(p.Address, p.Port, s.cfg.Gateway, tok, hostUser)}, nil
}

// agent authenticates an agent credential, before any of the body is read.
func (s *Server) agent(w http.ResponseWriter, r *http.Request) (*auth.AgentClaims, bool) {
	tok := bearer(r)
	if tok == "" {
		s.fail(w, r, http.StatusUnauthorized, "agent requests need Authorization: Bearer <credential from register>")
		return nil, false
	}
	c, err := s.tokens.VerifyAgent(tok)
	if err != nil {
		s.fail(w, r, http.StatusUnauthorized, "agent credential refused (%v): register again", err)
		return nil, false
	}
	return c, true
}

// sameHost checks that a report names the host its credential is for.
// Where the report is applied, the database (or the local host cache while
// it is away) checks the credential's registration too.
func (s *Server) sameHost(w http.ResponseWriter, r *http.Request, c *auth.AgentClaims, host string) bool {
	if c.Subject != host {
		s.fail(w, r, http.StatusForbidden, "this credential is for host %q, not %q", c.Subject, host)
		return false
	}
	return true
}

// register adds a host with a join token, which only ever creates new
// hosts in its own delivery group, or lets a host's own agent update its
// registration with the credential it was given. The bearer is checked
// before the body is read.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	if tok == "" {
		s.fail(w, r, http.StatusUnauthorized, "register with Authorization: Bearer <join token> (deskway token join --group NAME), or the host's own credential")
		return
	}
	jc, jerr := s.tokens.VerifyJoin(tok)
	var own *auth.AgentClaims // the host's credential, when that is the bearer
	if jerr != nil {
		c, aerr := s.tokens.VerifyAgent(tok)
		if aerr != nil {
			s.fail(w, r, http.StatusUnauthorized, "join token refused (%v): mint a new one with deskway token join", jerr)
			return
		}
		own = c
	}
	var group string
	if own != nil {
		group = own.Group
	} else {
		group = jc.Group
	}
	g, found := s.groups.Load().byName[group]
	if !found {
		s.fail(w, r, http.StatusForbidden, "the token is for delivery group %q, which this broker does not define", group)
		return
	}
	var req brokerapi.RegisterRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	switch {
	case !namePattern.MatchString(req.Name):
		s.fail(w, r, http.StatusBadRequest, "host name %q must be 1 to 253 letters, digits, dots, dashes or underscores", req.Name)
		return
	case req.Address == "" || len(req.Address) > 253 || strings.ContainsAny(req.Address, " /:\r\n") && net.ParseIP(req.Address) == nil:
		s.fail(w, r, http.StatusBadRequest, "address %q is not a host name or IP address", req.Address)
		return
	case req.Port < 1 || req.Port > 65535:
		s.fail(w, r, http.StatusBadRequest, "port %d is not 1 to 65535", req.Port)
		return
	case req.Weight < 0 || req.Weight > 100:
		s.fail(w, r, http.StatusBadRequest, "weight %g is not between 0 and 100", req.Weight)
		return
	case req.SessionLimit < 0:
		s.fail(w, r, http.StatusBadRequest, "session_limit %d is negative", req.SessionLimit)
		return
	case own != nil && own.Subject != req.Name:
		s.fail(w, r, http.StatusForbidden, "this credential is host %q's; it cannot register %q", own.Subject, req.Name)
		return
	}
	limit := g.SessionLimit
	if req.SessionLimit > 0 && req.SessionLimit < limit {
		limit = req.SessionLimit
	}
	weight := req.Weight
	if weight == 0 {
		weight = 1
	}
	zone := req.Zone
	switch {
	case own != nil && own.Zone != "":
		zone = own.Zone
	case own == nil && jc.Zone != "":
		zone = jc.Zone
	}
	h := store.Host{Name: req.Name, Group: g.Name, Zone: zone, Address: req.Address,
		Port: req.Port, Weight: weight, SessionLimit: limit, LogonLimit: g.LogonLimit, RegisteredAt: s.now()}
	var err error
	if own != nil {
		h.Registration = own.Registration
		err = s.store.UpdateHost(r.Context(), h)
	} else {
		h.Registration = store.NewID()
		err = s.store.JoinHost(r.Context(), h, jc.ID, jc.Uses, jc.ExpiresAt.Time)
	}
	switch {
	case errors.Is(err, store.ErrHostExists):
		s.log.Warn("join token refused for a registered host", "host", req.Name, "delivery_group", g.Name, "remote", r.RemoteAddr)
		s.fail(w, r, http.StatusConflict, "host %q is already registered: its own agent re-registers with its credential, "+
			"or an administrator removes it (DELETE /api/v1/broker/hosts/%s) before a join token may register the name again", req.Name, req.Name)
		return
	case errors.Is(err, store.ErrJoinTokenUsed):
		s.fail(w, r, http.StatusUnauthorized, "this join token has registered the %d hosts it may: mint a new one with deskway token join", jc.Uses)
		return
	case errors.Is(err, store.ErrNotFound):
		s.fail(w, r, http.StatusNotFound, "host %q of this credential is no longer registered in delivery group %q (removed, or removed and joined again): register it with a join token", req.Name, g.Name)
		return
	case err != nil:
		s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
		return
	}
	s.cache.register(h)
	cred, err := s.tokens.MintAgent(req.Name, g.Name, zone, h.Registration, AgentCredentialTTL)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "%v", err)
		return
	}
	how := "join token"
	if own != nil {
		how = "host credential"
	}
	s.log.Info("host registered", "host", req.Name, "delivery_group", g.Name, "zone", zone, "address", req.Address,
		"port", req.Port, "session_limit", limit, "weight", weight, "with", how)
	writeJSON(w, http.StatusOK, brokerapi.RegisterResponse{Host: req.Name, DeliveryGroup: g.Name, Credential: cred,
		HeartbeatInterval: s.cfg.HeartbeatInterval.D().Seconds()})
}

func fraction(name string, v float64) error {
	if v < 0 || v > 1 || v != v {
		return fmt.Errorf("%s %g is not a fraction between 0 and 1", name, v)
	}
	return nil
}

// rate checks a count per second (or share of a core): finite, not negative.
func rate(name string, v float64) error {
	if v < 0 || v != v || math.IsInf(v, 1) {
		return fmt.Errorf("%s %g is not a rate of 0 or more", name, v)
	}
	return nil
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	c, ok := s.agent(w, r)
	if !ok {
		return
	}
	var hb brokerapi.Heartbeat
	if err := decode(w, r, &hb); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if !s.sameHost(w, r, c, hb.Host) {
		return
	}
	err := errors.Join(fraction("cpu", hb.CPU), fraction("memory", hb.Memory), fraction("disk_idle", hb.DiskIdle),
		fraction("memory_pressure", hb.MemoryPressure), fraction("cpu_pressure", hb.CPUPressure), rate("major_faults_per_s", hb.MajorFaultsPerSec),
		rate("swap_in_per_s", hb.SwapInPerSec), rate("swap_out_per_s", hb.SwapOutPerSec))
	if hb.RDPDown < 0 || hb.RDPDown > 65535 {
		err = errors.Join(err, fmt.Errorf("rdp_down_port %d is not a port", hb.RDPDown))
	}
	if hb.DiskLatencyMS < 0 || hb.DiskLatencyMS != hb.DiskLatencyMS {
		err = errors.Join(err, fmt.Errorf("disk_latency_ms %g is negative", hb.DiskLatencyMS))
	}
	sessions := map[string]string{}
	var usage map[string]store.Usage
	for _, ss := range hb.Sessions {
		if ss.User == "" || (ss.State != store.Active && ss.State != store.Disconnected) {
			err = errors.Join(err, fmt.Errorf("session %+v needs a user and a state of active or disconnected", ss))
			break
		}
		if e := rate("cpu", ss.CPU); e != nil {
			err = errors.Join(err, fmt.Errorf("session of %q: %w", ss.User, e))
			break
		}
		// A desktop account's session is its portal user's: the one the
		// broker placed and the portal shows.
		user := s.users.PortalUser(ss.User)
		sessions[user] = ss.State
		if usage == nil {
			usage = map[string]store.Usage{}
		}
		usage[user] = store.Usage{Memory: ss.MemoryBytes, CPU: ss.CPU}
	}
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	rep := store.Report{Host: hb.Host, Registration: c.Registration, CPU: hb.CPU, Mem: hb.Memory, DiskIdle: hb.DiskIdle, DiskLatency: hb.DiskLatencyMS,
		MemPressure: hb.MemoryPressure, CPUPressure: hb.CPUPressure, MajorFaults: hb.MajorFaultsPerSec, SwapIn: hb.SwapInPerSec, SwapOut: hb.SwapOutPerSec,
		Unhealthy: Unhealthy(s.cfg.Health, hb), Drain: hb.Drain, Sessions: sessions, Usage: usage,
		Now: s.now(), LogonGrace: s.cfg.LogonGrace.D()}
	if g, ok := s.groups.Load().byName[c.Group]; ok {
		rep.TrustSessions = g.TrustHostSessions
	}
	err = s.applyReport(r.Context(), rep)
	if errors.Is(err, store.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, "host %q of this credential is not registered (removed, or removed and joined again): register it with a join token", hb.Host)
		return
	}
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
		return
	}
	s.m.heartbeats.Inc()
	var cmds []store.Command
	if !s.offline.Load() {
		if cmds, err = s.store.TakeCommands(r.Context(), hb.Host, s.now(), s.commandTTL()); err != nil && r.Context().Err() == nil {
			// They stay queued for the next heartbeat.
			s.log.Warn("could not hand a host its commands", "host", hb.Host, "error", err)
		}
	}
	if len(cmds) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	resp := brokerapi.HeartbeatResponse{}
	for _, c := range cmds {
		// The host knows the session by its own account's name.
		hostUser := c.User
		if d, ok := s.users.Desktop(c.User); ok {
			hostUser = d.Account
		}
		resp.Commands = append(resp.Commands, brokerapi.Command{ID: c.ID, SessionID: c.SessionID, User: hostUser, Kind: c.Kind, Text: c.Text})
		s.log.Info("session command sent to host", "command", c.ID, "kind", c.Kind, "host", hb.Host, "user", c.User, "session", c.SessionID)
	}
	writeJSON(w, http.StatusOK, resp)
}

// commandTTL is how long a session command waits for its host's agent to
// take it and answer (two minutes, or four heartbeats if longer); past
// it, the command reads as expired.
func (s *Server) commandTTL() time.Duration {
	return max(2*time.Minute, 4*s.cfg.HeartbeatInterval.D())
}

// maxCommandText bounds a message and an agent's failure reason.
const maxCommandText = 1000

// commandResult records an agent's answer to a command it was sent.
func (s *Server) commandResult(w http.ResponseWriter, r *http.Request) {
	c, ok := s.agent(w, r)
	if !ok {
		return
	}
	var res brokerapi.CommandResult
	if err := decode(w, r, &res); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if !s.sameHost(w, r, c, res.Host) {
		return
	}
	if len(res.Error) > maxCommandText {
		res.Error = res.Error[:maxCommandText]
	}
	id := r.PathValue("id")
	err := s.store.FinishCommand(r.Context(), res.Host, c.Registration, id, res.Error, s.now())
	if errors.Is(err, store.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, "host %q was sent no command %q that waits for an answer", res.Host, id)
		return
	}
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
		return
	}
	if res.Error != "" {
		s.log.Warn("session command failed on host", "command", id, "host", res.Host, "error", res.Error)
	} else {
		s.log.Info("session command carried out", "command", id, "host", res.Host)
	}
	w.WriteHeader(http.StatusNoContent)
}

// commandStatus is a command as the admin API shows it.
func commandStatus(c store.Command) brokerapi.CommandStatus {
	return brokerapi.CommandStatus{Command: brokerapi.Command{ID: c.ID, SessionID: c.SessionID, User: c.User, Kind: c.Kind, Text: c.Text},
		Host: c.Host, State: c.State, Error: c.Error}
}

// queueCommand is the admin API's logoff, disconnect and message.
func (s *Server) queueCommand(w http.ResponseWriter, r *http.Request) {
	id, kind := r.PathValue("id"), r.PathValue("kind")
	if kind != brokerapi.Logoff && kind != brokerapi.Disconnect && kind != brokerapi.Message {
		s.fail(w, r, http.StatusNotFound, "no session command %q: logoff, disconnect or message", kind)
		return
	}
	var req brokerapi.CommandRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, http.StatusBadRequest, "%v", err)
			return
		}
	}
	switch {
	case kind == brokerapi.Message && strings.TrimSpace(req.Text) == "":
		s.fail(w, r, http.StatusBadRequest, `a message needs {"text": "..."}`)
		return
	case kind != brokerapi.Message && req.Text != "":
		s.fail(w, r, http.StatusBadRequest, "%s takes no text; send a message for that", kind)
		return
	case len(req.Text) > maxCommandText:
		s.fail(w, r, http.StatusBadRequest, "the message is %d bytes; at most %d", len(req.Text), maxCommandText)
		return
	case strings.ContainsFunc(req.Text, func(c rune) bool { return c != '\n' && (unicode.IsControl(c) || unicode.Is(unicode.Bidi_Control, c)) }):
		s.fail(w, r, http.StatusBadRequest, "the message holds control or text-direction characters; only newlines may break it")
		return
	}
	var c store.Command
	var err error
	if s.offlineFor(r.Context(), func() error { c, err = s.store.QueueCommand(r.Context(), id, kind, req.Text, s.now()); return err }) {
		s.fail(w, r, http.StatusServiceUnavailable, "session commands need the database, which is unreachable: try again when it returns")
		return
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		s.fail(w, r, http.StatusNotFound, "no session with id %q (deskway session ls)", id)
		return
	case errors.Is(err, store.ErrSessionEnded):
		s.fail(w, r, http.StatusConflict, "session %q has ended", id)
		return
	case err != nil:
		s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
		return
	}
	s.log.Info("session command queued", "command", c.ID, "kind", kind, "session", id, "host", c.Host, "user", c.User)
	w.Header().Set("Location", "/api/v1/broker/commands/"+c.ID)
	writeJSON(w, http.StatusAccepted, commandStatus(c))
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	c, ok := s.agent(w, r)
	if !ok {
		return
	}
	var ev brokerapi.Events
	if err := decode(w, r, &ev); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if !s.sameHost(w, r, c, ev.Host) {
		return
	}
	for _, e := range ev.Events {
		if e.User == "" || (e.State != store.Active && e.State != store.Disconnected && e.State != store.Ended) {
			s.fail(w, r, http.StatusBadRequest, "event %+v needs a user and a state of active, disconnected or ended", e)
			return
		}
	}
	now := s.now()
	// Consecutive events of one state go to the store together: a batch of
	// logons costs one statement, and the order of a user's events holds.
	for i := 0; i < len(ev.Events); {
		j, users := i, []string{}
		for ; j < len(ev.Events) && ev.Events[j].State == ev.Events[i].State; j++ {
			users = append(users, s.users.PortalUser(ev.Events[j].User))
		}
		e := store.Event{Host: ev.Host, Registration: c.Registration, Users: users, State: ev.Events[i].State, Now: now}
		changed, err := s.applyEvent(r.Context(), e)
		if errors.Is(err, store.ErrNotFound) {
			s.fail(w, r, http.StatusNotFound, "host %q of this credential is not registered (removed, or removed and joined again): register it with a join token", ev.Host)
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		s.log.Debug("session events", "host", ev.Host, "users", users, "state", ev.Events[i].State, "changed", changed)
		i = j
	}
	w.WriteHeader(http.StatusNoContent)
}

// viaDatabase runs online while the database answers, and offline (the
// local host cache and the journal of the outage, which takes it to the
// database in its turn when it returns) while it is away; wasOffline says
// which did. A request that finds the database back just as it was to be
// journaled goes to the database.
func (s *Server) viaDatabase(ctx context.Context, online, offline func() error) (wasOffline bool, err error) {
	for {
		if !s.offline.Load() {
			err := online()
			if err == nil || errors.Is(err, store.ErrNotFound) || ctx.Err() != nil || !s.dbDown(err) {
				return false, err
			}
		}
		if err := offline(); !errors.Is(err, errBackOnline) {
			return true, err
		}
	}
}

// applyReport stores a heartbeat, through viaDatabase.
func (s *Server) applyReport(ctx context.Context, rep store.Report) error {
	_, err := s.viaDatabase(ctx, func() error {
		err := s.store.Heartbeat(ctx, rep)
		if err == nil {
			s.cache.heartbeat(rep)
		}
		return err
	}, func() error { return s.cache.offlineHeartbeat(rep) })
	return err
}

// applyEvent stores session events, through viaDatabase; changed says
// whether the database changed a session (false while it is away).
func (s *Server) applyEvent(ctx context.Context, e store.Event) (changed bool, err error) {
	_, err = s.viaDatabase(ctx, func() error {
		var err error
		if changed, err = s.store.Event(ctx, e); err == nil {
			s.cache.event(e)
		}
		return err
	}, func() error { changed = false; return s.cache.offlineEvent(e) })
	return changed, err
}

// applyDrain stores an administrator's drain, through viaDatabase.
func (s *Server) applyDrain(ctx context.Context, host string, drain bool) (offline bool, err error) {
	return s.viaDatabase(ctx, func() error {
		err := s.store.SetAdminDrain(ctx, host, drain)
		if err == nil {
			s.cache.drain(host, drain)
		}
		return err
	}, func() error { return s.cache.offlineDrain(host, drain) })
}

// AdminHandler serves the broker's part of the admin API.
func (s *Server) AdminHandler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/broker/hosts", func(w http.ResponseWriter, r *http.Request) {
		group := r.URL.Query().Get("delivery_group")
		var hosts []store.Host
		var err error
		if s.offlineFor(r.Context(), func() error { hosts, err = s.store.Hosts(r.Context(), group); return err }) {
			hosts, err = s.cache.snapshot(group), nil
			fromCache(w)
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		stale := s.now().Add(-s.cfg.HeartbeatTimeout.D())
		out := make([]map[string]any, 0, len(hosts))
		for _, h := range hosts {
			out = append(out, map[string]any{"name": h.Name, "delivery_group": h.Group, "zone": h.Zone,
				"address": h.Address, "port": h.Port, "weight": h.Weight, "session_limit": h.SessionLimit,
				"logon_limit": h.LogonLimit, "sessions": h.Sessions, "pending_logons": h.Pending, "cpu": h.CPU,
				"memory": h.Mem, "disk_idle": h.DiskIdle, "disk_latency_ms": h.DiskLatency,
				"memory_pressure": h.MemPressure, "cpu_pressure": h.CPUPressure, "major_faults_per_s": h.MajorFaults, "swap_in_per_s": h.SwapIn,
				"swap_out_per_s": h.SwapOut, "session_memory_bytes": h.SessionMemory, "unhealthy": h.Unhealthy,
				"admin_drain": h.AdminDrain, "agent_drain": h.AgentDrain, "assigned_user": h.AssignedUser,
				"last_seen": h.LastSeen, "status": HostStatus(h, stale, false, "")})
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("GET /api/v1/broker/sessions", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		sq := store.SessionQuery{User: q.Get("user"), Host: q.Get("host"), All: q.Get("all") == "1", LoggedOn: q.Get("logged_on") == "1", Limit: 1000}
		for key, dst := range map[string]*int{"limit": &sq.Limit, "offset": &sq.Offset} {
			if v := q.Get(key); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 || key == "limit" && (n < 1 || n > 1000) {
					s.fail(w, r, http.StatusBadRequest, "%s %q: limit is 1 to 1000, offset 0 or more", key, v)
					return
				}
				*dst = n
			}
		}
		var ss []store.Session
		var total int
		var err error
		if s.offlineFor(r.Context(), func() error {
			ss, total, err = s.store.SessionPage(r.Context(), sq)
			return err
		}) {
			ss, err = s.cache.sessions(q.Get("user")), nil
			if sq.LoggedOn {
				ss = slices.DeleteFunc(ss, func(x store.Session) bool { return x.State == store.Launching })
			}
			total = len(ss)
			fromCache(w)
		}
		w.Header().Set("Deskway-Total", strconv.Itoa(total))
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		out := make([]map[string]any, 0, len(ss))
		for _, x := range ss {
			out = append(out, map[string]any{"id": x.ID, "user": x.User, "delivery_group": x.Group, "host": x.Host,
				"state": x.State, "created": x.CreatedAt, "updated": x.UpdatedAt, "verified": !x.Unverified,
				"memory_bytes": x.Memory, "cpu": x.CPU})
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("DELETE /api/v1/broker/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		var live bool
		var err error
		if s.offlineFor(r.Context(), func() error { live, err = s.store.EndSession(r.Context(), id, s.now()); return err }) {
			s.fail(w, r, http.StatusServiceUnavailable, "ending a session record needs the database, which is unreachable: try again when it returns")
			return
		}
		if errors.Is(err, store.ErrNotFound) || err == nil && !live {
			s.fail(w, r, http.StatusNotFound, "no live session with id %q", id)
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		s.cache.end(id)
		s.log.Info("session record ended by administrator", "session", id)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /api/v1/broker/groups", s.adminGroups)
	mux.HandleFunc("PUT /api/v1/broker/groups/{name}/entitlements", s.setEntitlement)
	mux.HandleFunc("DELETE /api/v1/broker/groups/{name}/entitlements", s.clearEntitlement)
	mux.HandleFunc("POST /api/v1/broker/sessions/{id}/{kind}", s.queueCommand)
	mux.HandleFunc("GET /api/v1/broker/commands/{id}", func(w http.ResponseWriter, r *http.Request) {
		var c store.Command
		var err error
		if s.offlineFor(r.Context(), func() error {
			c, err = s.store.CommandByID(r.Context(), r.PathValue("id"), s.now(), s.commandTTL())
			return err
		}) {
			s.fail(w, r, http.StatusServiceUnavailable, "session commands are kept in the database, which is unreachable: try again when it returns")
			return
		}
		if errors.Is(err, store.ErrNotFound) {
			s.fail(w, r, http.StatusNotFound, "no command %q", r.PathValue("id"))
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		writeJSON(w, http.StatusOK, commandStatus(c))
	})
	mux.HandleFunc("DELETE /api/v1/broker/hosts/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		var err error
		if s.offlineFor(r.Context(), func() error { err = s.store.RemoveHost(r.Context(), name); return err }) {
			s.fail(w, r, http.StatusServiceUnavailable, "removing a host needs the database, which is unreachable: try again when it returns (drain the host meanwhile)")
			return
		}
		if errors.Is(err, store.ErrNotFound) {
			s.fail(w, r, http.StatusNotFound, "no host named %q", name)
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusConflict, "%v", err)
			return
		}
		s.cache.remove(name)
		s.log.Info("host removed by administrator", "host", name)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /api/v1/broker/hosts/{name}/drain", s.drainHost(false))
	// Undrain has a path of its own so that the audit trail, which keeps
	// the method and path, tells it from drain.
	mux.HandleFunc("POST /api/v1/broker/hosts/{name}/undrain", s.drainHost(true))
	return mux
}

// drainHost sets a host's admin drain: as the body says, or off for
// undrain, which takes no body.
func (s *Server) drainHost(undrain bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req brokerapi.DrainRequest
		if !undrain {
			if err := decode(w, r, &req); err != nil {
				s.fail(w, r, http.StatusBadRequest, "%v", err)
				return
			}
		}
		name := r.PathValue("name")
		offline, err := s.applyDrain(r.Context(), name, req.Drain)
		if errors.Is(err, store.ErrNotFound) {
			s.fail(w, r, http.StatusNotFound, "no host named %q", name)
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		if offline {
			fromCache(w)
		}
		s.log.Info("drain", "host", name, "drain", req.Drain, "offline", offline)
		writeJSON(w, http.StatusOK, map[string]any{"host": name, "admin_drain": req.Drain})
	}
}

// offlineFor runs query unless the database is known to be unreachable,
// and reports whether the answer must come from the local host cache
// instead: the database was unreachable, or became so during query.
func (s *Server) offlineFor(ctx context.Context, query func() error) bool {
	if s.offline.Load() {
		return true
	}
	err := query()
	return err != nil && ctx.Err() == nil && s.dbDown(err)
}

// fromCache marks an admin answer as the local host cache's: current as
// far as this broker knows, but not the database's.
func fromCache(w http.ResponseWriter) {
	w.Header().Set("Deskway-Source", "local-host-cache")
	w.Header().Set("Warning", `199 deskway "the database is unreachable: answered from this broker's local host cache"`)
}

type metrics struct {
	busyWaits  prometheus.Counter
	offline    prometheus.Gauge
	launches   *prometheus.CounterVec
	latency    prometheus.Histogram
	inflight   prometheus.Gauge
	heartbeats prometheus.Counter
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
		offline: prometheus.NewGauge(prometheus.GaugeOpts{Name: "deskway_broker_database_unreachable",
			Help: "1 while launches are placed from the local host cache because the database does not answer."}),
	}
	// Each result is a series at 0 from the start, so that an alert on
	// rate(...{result="no_host"}) sees the first refusal.
	for _, r := range []string{"placed", "reconnected", "placed_offline", "reconnected_offline", "no_host", "throttled", "denied", "bad_request", "error"} {
		m.launches.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.launches, m.latency, m.inflight, m.heartbeats, m.offline, m.busyWaits)
	}
	return m
}
