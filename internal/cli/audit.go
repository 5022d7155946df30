package cli

import (
	"context"
	"sync"

	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/obs"
)

// auditStore is where storeAudit keeps the trail: the broker's database.
type auditStore interface {
	RecordAudit(ctx context.Context, a store.AuditRecord) error
	Audit(ctx context.Context, limit int) ([]store.AuditRecord, error)
}

// storeAudit keeps the admin API's audit trail in the broker's database,
// where every broker sharing it, and its administrators, read one trail.
// Actions taken while the database is away (a drain during an outage)
// wait in memory and are written, with their own times, once it answers.
type storeAudit struct {
	st auditStore

	mu      sync.Mutex
	pending []store.AuditRecord
}

// flushLocked writes the waiting actions, oldest first, until one fails.
func (s *storeAudit) flushLocked(ctx context.Context) error {
	for len(s.pending) > 0 {
		if err := s.st.RecordAudit(ctx, s.pending[0]); err != nil {
			return err
		}
		s.pending = s.pending[1:]
	}
	return nil
}

func (s *storeAudit) Record(ctx context.Context, e obs.AuditEntry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = append(s.pending, store.AuditRecord{At: e.Time, Actor: e.Actor, Action: e.Action, Source: e.Source, Status: e.Status})
	if len(s.pending) > 10000 {
		s.pending = s.pending[len(s.pending)-10000:] // the log keeps the rest
	}
	return s.flushLocked(ctx)
}

func (s *storeAudit) List(ctx context.Context, limit int) ([]obs.AuditEntry, error) {
	s.mu.Lock()
	err := s.flushLocked(ctx)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	recs, err := s.st.Audit(ctx, limit)
	if err != nil {
		return nil, err
	}
	out := make([]obs.AuditEntry, len(recs))
	for i, r := range recs {
		out[i] = obs.AuditEntry{Time: r.At, Actor: r.Actor, Action: r.Action, Source: r.Source, Status: r.Status}
	}
	return out, nil
}
