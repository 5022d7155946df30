package broker

// Settling: the time, after a broker is back on the database (or learns
// that a peer is away from it), until every peer has written back what it
// placed while away from it.

import (
	"context"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
)

// peerSettleMax is how long after this broker is back on the database
// (or learns that a peer is away from it) a peer that does not answer is
// still waited for. A peer that answers is asked until it says it has
// written back, however long that takes: while it is away from the
// database it places from its own copy, and only it can say whom. One
// that is silent is dead or cut off; it writes its journal back when it
// returns (a broker does so before it serves), and this bounds the
// launches here that wait broker.peer_timeout for it meanwhile. Peers
// write back at their next try of the database, every cacheRefresh,
// which takes seconds to a few tens of them on a busy machine
// (retryConflict).
const peerSettleMax = 30 * time.Second

// What a broker on the database does with a peer before placing a user
// (peer.settle).
const (
	unsettled int32 = iota // ask it
	settled                // it has said its journal is written back
	givenUp                // silent for peerSettleMax: not asked again until this broker loses the database
)

// unsettle has this broker, which has just lost the database, ask every
// peer again once it is back: each may place users meanwhile that only
// it knows of until it writes them back.
func (s *Server) unsettle() {
	for _, p := range s.peers.Load().list {
		p.settle.Store(unsettled)
	}
}

// settleAll is a start on the database: no peer is asked until one is
// known to be away from it.
func (s *Server) settleAll() {
	for _, p := range s.peers.Load().list {
		p.settle.Store(settled)
	}
}

// peerAway is a peer's question saying it is away from the database:
// whichever peer it is (the question does not say), it may place users
// from its copy that no row of the database holds, so every peer that
// had settled is asked again before a user is placed here.
func (s *Server) peerAway() {
	again := false
	for _, p := range s.peers.Load().list {
		again = p.settle.CompareAndSwap(settled, unsettled) || again
	}
	if again {
		s.waitForPeers()
		s.log.Info("a peer broker is away from the database: launches here ask the peers first until they have written back what they placed meanwhile")
	}
}

// waitForPeers starts the time a silent peer is waited for: when the
// database is back (before launches are placed in it), and when a peer
// says it is away from it.
func (s *Server) waitForPeers() {
	s.settleBy.Store(s.now().Add(s.settleMax).UnixMilli())
}

// settleUser runs before a launch is placed in the database while some
// peer has not said it has nothing left to write back. It asks those
// peers for the user's sessions; a live placement one holds in the
// launch's group that is not written back yet (it may be in no row of
// the database, or only as the unverified record a host's report made
// of it) is written back here and now, through Store.Restore, so that
// the placement that follows sends the user back to it rather than
// placing a second session. The peer's own write-back of it later finds
// it stored and skips it; Restore also takes over the unverified record
// (adoptReported), so exactly one live record is left. A peer that says
// it has written back is not asked again until this broker next loses
// the database or a peer says it is away from it; one that does not
// answer is given up on once peerSettleMax has passed since then.
func (s *Server) settleUser(ctx context.Context, l store.Launch) {
	var open []*peer
	for _, p := range s.peers.Load().list {
		if p.settle.Load() == unsettled {
			open = append(open, p)
		}
	}
	if len(open) == 0 {
		return
	}
	tok, err := s.tokens.MintPeer(l.User, nil, peerTokenTTL)
	if err != nil {
		s.log.Warn("could not sign a question to the peer brokers; placing without it", "user", l.User, "error", err)
		return
	}
	qctx, cancel := context.WithTimeout(ctx, s.peers.Load().timeout)
	defer cancel()
	var (
		mu   sync.Mutex
		held []store.Session
		wg   sync.WaitGroup
	)
	for _, p := range open {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := s.question(qctx, p, tok, brokerapi.PeerQuery{User: l.User})
			switch {
			case res == nil:
				if s.now().UnixMilli() > s.settleBy.Load() && p.settle.CompareAndSwap(unsettled, givenUp) {
					s.log.Warn("a peer broker has not answered since the database came back; no longer waiting for it to write back what it placed while the database was away: until it does, a user it placed then may get a second session here",
						"peer", p.client.Base, "waited", s.settleMax)
				}
				return
			case !res.JournalPending:
				s.m.peerQueries.WithLabelValues("none").Inc()
				if p.settle.CompareAndSwap(unsettled, settled) {
					s.log.Info("a peer broker has written back what it placed while the database was away", "peer", p.client.Base)
				}
				return
			}
			found := false
			for _, ps := range res.Sessions {
				// A session the peer knows only from a host's report has no
				// id: its record is in the database, or in the journal of
				// the broker that placed it, which is asked too.
				if ps.ID == "" || ps.DeliveryGroup != l.Group || ps.State == store.Ended {
					continue
				}
				found = true
				mu.Lock()
				held = append(held, store.Session{ID: ps.ID, User: l.User, Group: ps.DeliveryGroup, Host: ps.Host, State: ps.State,
					CreatedAt: ps.CreatedAt, UpdatedAt: ps.UpdatedAt})
				mu.Unlock()
				s.log.Info("a peer broker holds the user's placement from the outage, not written back yet: it is written back now and the launch goes back to it",
					"peer", p.client.Base, "user", l.User, "host", ps.Host, "session", ps.ID)
			}
			result := "none"
			if found {
				result = "found"
			}
			s.m.peerQueries.WithLabelValues(result).Inc()
		}()
	}
	wg.Wait()
	personal := s.groups.Load().personal
	for _, ss := range held {
		err := retryConflict(ctx, func() error {
			dctx, cancel := dbCall(ctx)
			defer cancel()
			_, err := s.store.Restore(dctx, []store.Session{ss}, personal)
			return err
		})
		if err != nil {
			// The placement that follows decides alone; the peer's own
			// write-back stores its session in its turn.
			s.log.Warn("could not write back a peer broker's placement of the user before placing them", "user", l.User, "session", ss.ID, "error", err)
		}
	}
}
