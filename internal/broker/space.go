package broker

import (
	"context"
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
	// reclaiming is set while a checkpoint gives back the write-ahead
	// log's space.
	reclaiming atomic.Bool
}

// noSpace reports whether err says the database's disk is full. If so it
// warns, at most once a second, naming the state directory, and starts
// giving back the space the database's write-ahead log holds: without
// that, a SQLite log that filled the disk keeps it full after the
// operator has freed space, and the broker needs a restart.
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
	if s.space.reclaiming.CompareAndSwap(false, true) {
		go func() {
			defer s.space.reclaiming.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if err := s.store.Reclaim(ctx); err != nil {
				s.log.Debug("could not give back the database log's space yet", "error", err)
			}
		}()
	}
	return true
}
