package cli

import (
	"context"

	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/obs"
)

// storeAudit keeps the admin API's audit trail in the broker's database,
// where every broker sharing it, and its administrators, read one trail.
type storeAudit struct{ st *store.Store }

func (s storeAudit) Record(ctx context.Context, e obs.AuditEntry) error {
	return s.st.RecordAudit(ctx, store.AuditRecord{At: e.Time, Actor: e.Actor, Action: e.Action, Source: e.Source, Status: e.Status})
}

func (s storeAudit) List(ctx context.Context, limit int) ([]obs.AuditEntry, error) {
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
