package broker

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
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
		s.unsettle()
		s.m.offline.Set(1)
		s.log.Warn("database unreachable: placing launches from the local host cache until it returns", "error", cause)
	}
	return true
}

// place asks the database, or the local host cache when the database is
// unreachable; offline says which answered.
//
// A placement given up on at the database may still run there: sent
// before the link was cut, it waits in the network and reaches the
// database when the link returns. The cache places the launch under the
// same session id, so the write-back puts the session where the user was
// told; a launch the cache answers otherwise (the user's session it
// knows, no host) journals the id as void, and the write-back deletes
// what the late statement stored before anything else.
//
// Back on the database, the launch first asks the peers that may still
// hold placements they made while it was away (settleUser).
func (s *Server) place(ctx context.Context, l store.Launch) (p store.Placement, offline bool, err error) {
	gaveUp := false
	if !s.offline.Load() {
		s.settleUser(ctx, l)
		dctx, cancel := context.WithTimeout(ctx, dbTimeout)
		p, err = s.store.Place(dctx, l)
		cancel()
		if err == nil {
			s.cache.placed(l, p)
			return p, false, nil
		}
		if errors.Is(err, store.ErrNoHost) || !s.dbDown(err) {
			return p, false, err
		}
		if ctx.Err() != nil {
			// The client is gone: nothing is placed, and the statement
			// must not take effect late either.
			s.voidLate(l.SessionID)
			return p, false, err
		}
		gaveUp = true
	}
	if len(s.peers.Load().list) > 0 && s.offline.Load() {
		if ok, host := s.cache.usable(l.User, l.Group, l.Stale); !ok {
			var hosts []string
			if host != "" {
				hosts = []string{host}
			}
			s.askPeers(ctx, l.User, hosts)
		}
	}
	p, err = s.cache.place(l)
	if errors.Is(err, errBackOnline) {
		return s.place(ctx, l)
	}
	if gaveUp && (err != nil || p.SessionID != l.SessionID) {
		s.voidLate(l.SessionID)
	}
	return p, true, err
}

// voidLate journals id as a placement given up on. Failing that, the
// launch is answered all the same: the late statement, if it ever runs,
// stores a session the host's reports end once its logon grace passes.
func (s *Server) voidLate(id string) {
	if err := s.cache.void(id); err != nil && !errors.Is(err, errBackOnline) {
		s.log.Warn("could not journal a placement given up on at the database", "session", id, "error", err)
	}
}

// dbCall bounds one database call made for a request: past dbTimeout the
// database counts as unreachable, as when it refuses connections. A cut
// link refuses nothing, and a query sent into it would otherwise wait as
// long as its caller.
func dbCall(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, dbTimeout)
}

// viaDatabase runs online while the database answers, and offline (the
// local host cache and the journal of the outage, which takes it to the
// database in its turn when it returns) while it is away; wasOffline says
// which did. A request that finds the database back just as it was to be
// journaled goes to the database.
func (s *Server) viaDatabase(ctx context.Context, online func(context.Context) error, offline func() error) (wasOffline bool, err error) {
	for {
		if !s.offline.Load() {
			dctx, cancel := dbCall(ctx)
			err := online(dctx)
			cancel()
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
	_, err := s.viaDatabase(ctx, func(ctx context.Context) error {
		err := s.store.Heartbeat(ctx, rep)
		if err == nil {
			known := s.cache.heartbeat(rep)
			if !known || s.cache.unknown(rep) {
				s.learnHost(ctx, rep, !known)
			}
		}
		return err
	}, func() error {
		return s.admitUnknown(ctx, rep.Host, func() error { return s.cache.offlineHeartbeat(rep) })
	})
	return err
}

// admitUnknown runs journal, an agent's report while the database is
// away; should the copy not hold the report's host (it registered
// through another broker since the copy's last reload), it asks the
// peers for the host first and runs journal again with what they knew.
func (s *Server) admitUnknown(ctx context.Context, host string, journal func() error) error {
	err := journal()
	if !errors.Is(err, errUnknownHost) || len(s.peers.Load().list) == 0 {
		return err
	}
	s.askPeers(ctx, "", []string{host})
	return journal()
}

// learnHost reads into the local host cache what a host's report shows
// it lacks: the host itself (withHost: it registered through another
// broker since the last reload), and the host's live sessions, when the
// report names one the cache does not hold (another broker placed it).
// Were the database to go away now, this broker would still place on
// that host and send those users back to their sessions. A failure
// leaves the cache as it was, to be reloaded in its time.
func (s *Server) learnHost(ctx context.Context, rep store.Report, withHost bool) {
	host := rep.Host
	if withHost {
		hosts, err := s.store.Hosts(ctx, "")
		if err != nil {
			s.log.Debug("local host cache: reading a new host", "host", host, "error", err)
			return
		}
		for _, h := range hosts {
			if h.Name == host {
				s.cache.register(h)
				s.cache.heartbeat(rep)
			}
		}
	}
	ss, _, err := s.store.SessionPage(ctx, store.SessionQuery{Host: host, Limit: 100000})
	if err != nil {
		s.log.Debug("local host cache: reading a host's sessions", "host", host, "error", err)
		return
	}
	s.cache.learn(ss)
}

// applyEvent stores session events, through viaDatabase; changed says
// whether the database changed a session (false while it is away).
func (s *Server) applyEvent(ctx context.Context, e store.Event) (changed bool, err error) {
	_, err = s.viaDatabase(ctx, func(ctx context.Context) error {
		var err error
		if changed, err = s.store.Event(ctx, e); err == nil {
			s.cache.event(e)
			// As for a heartbeat: a session another broker placed, read
			// now, lets this broker send the user's next launch back to it
			// should the database be away by then.
			if s.cache.unknownEvent(e) {
				s.learnHost(ctx, store.Report{Host: e.Host}, false)
			}
		}
		return err
	}, func() error {
		changed = false
		return s.admitUnknown(ctx, e.Host, func() error { return s.cache.offlineEvent(e) })
	})
	return changed, err
}

// applyDrain stores an administrator's drain, through viaDatabase.
func (s *Server) applyDrain(ctx context.Context, host string, drain bool) (offline bool, err error) {
	return s.viaDatabase(ctx, func(ctx context.Context) error {
		err := s.store.SetAdminDrain(ctx, host, drain)
		if err == nil {
			s.cache.drain(host, drain)
		}
		return err
	}, func() error { return s.cache.offlineDrain(host, drain) })
}

// offlineFor runs query unless the database is known to be unreachable,
// and reports whether the answer must come from the local host cache
// instead: the database was unreachable, or became so during query.
func (s *Server) offlineFor(ctx context.Context, query func(context.Context) error) bool {
	if s.offline.Load() {
		return true
	}
	dctx, cancel := dbCall(ctx)
	err := query(dctx)
	cancel()
	return err != nil && ctx.Err() == nil && s.dbDown(err)
}

// fromCache marks an admin answer as the local host cache's: current as
// far as this broker knows, but not the database's.
func fromCache(w http.ResponseWriter) {
	w.Header().Set("Deskway-Source", "local-host-cache")
	w.Header().Set("Warning", `199 deskway "the database is unreachable: answered from this broker's local host cache"`)
}
