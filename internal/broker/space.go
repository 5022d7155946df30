package broker

import (
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
)

// noSpaceMsg is what a client is told while the disk of the broker's
// database is full: the request changed nothing, and may succeed later.
const noSpaceMsg = "the broker cannot record anything right now: the disk of its database has no space left. Nothing was changed; try again in a moment"

// diskSpace tracks a full disk under the broker's database and state
// directory.
type diskSpace struct {
	dir string
	// warned is when the last warning was logged (Unix nanoseconds).
	warned atomic.Int64
}

// noSpace reports whether err says the database's disk is full. If so it
// warns, at most once a second, naming the state directory: the
// operator's cue, since the client is told only that there is no room.
func (s *Server) noSpace(err error) bool {
	if !store.NoSpace(err) {
		return false
	}
	now := time.Now().UnixNano()
	last := s.space.warned.Load()
	if now-last >= int64(time.Second) && s.space.warned.CompareAndSwap(last, now) {
		s.log.Warn("no space left on the disk of the broker's state directory: launches and changes are refused, whole, until there is room",
			"state_dir", s.space.dir, "error", err)
	}
	return true
}
