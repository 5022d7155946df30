package broker

import "time"

// SetPeerSettleMax sets how long a peer that does not answer is waited
// for after the database returns (peerSettleMax), from the next time it
// does: a test of that bound need not last the production one.
func SetPeerSettleMax(s *Server, d time.Duration) {
	s.settleMax = d
}
