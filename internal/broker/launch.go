package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
)

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
	if s.offlineFor(ctx, func(ctx context.Context) error {
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
	if s.offlineFor(ctx, func(ctx context.Context) error {
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
				dctx, cancel := dbCall(ctx)
				hosts, herr := s.store.Hosts(dctx, g.Name)
				cancel()
				if herr != nil {
					s.m.launches.WithLabelValues("no_host").Inc()
					return nil, s.slowDatabase(who.user, fmt.Errorf("listing the hosts of %q: %w", g.Name, herr), retryAfter)
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
		if s.noSpace(err) {
			return nil, refuse(http.StatusServiceUnavailable, "%s", noSpaceMsg)
		}
		return nil, s.slowDatabase(who.user, err, retryAfter)
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

// slowDatabase answers a launch whose placement the database did not
// finish, though it still answers a ping (a statement queued behind a
// lock, a stall of the machine): busy, not broken. The client is told to
// try again after retryAfter rather than given up on, and the cause goes
// to the log, not to the user. The statement was cancelled with its
// context, so it placed nothing; if it ran to its end all the same, the
// user's retry finds that placement, and the host's reports end it after
// broker.logon_grace if nobody comes.
func (s *Server) slowDatabase(user string, cause error, retryAfter time.Duration) *refusal {
	s.log.Warn("launch: the database did not finish the placement; the client is told to retry", "user", user, "error", cause)
	rf := refuse(http.StatusServiceUnavailable, "the session database is slow to answer right now; try again in a moment")
	rf.retryAfter = retryAfter
	return rf
}
