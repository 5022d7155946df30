package broker

import (
	"context"
	"time"
)

// SetPeerSettleMax sets how long a peer that does not answer is waited
// for after the database returns (peerSettleMax), from the next time it
// does: a test of that bound need not last the production one.
func SetPeerSettleMax(s *Server, d time.Duration) {
	s.settleMax = d
}

// ReadForCache does the reading half of a refresh of s's local host
// cache now and returns the other half, to run later: a test puts
// launches and events between the two, where a refresh may find them.
func ReadForCache(ctx context.Context, s *Server) (apply func(), err error) {
	r, err := s.readForCache(ctx, true)
	if err != nil {
		return nil, err
	}
	return func() { s.applyCacheRead(r) }, nil
}
