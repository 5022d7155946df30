package store

import (
	"context"
	"fmt"
	"time"
)

// AuditRecord is one administrator's action, as the audit table keeps it.
type AuditRecord struct {
	At     time.Time
	Actor  string
	Action string
	Source string
	Status int
}

// RecordAudit appends an administrator's action to the audit table.
func (s *Store) RecordAudit(ctx context.Context, a AuditRecord) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO audit (id, at, actor, action, source, status) VALUES ($1, $2, $3, $4, $5, $6)`,
		NewID(), a.At.UnixMilli(), a.Actor, a.Action, a.Source, a.Status); err != nil {
		return fmt.Errorf("store: audit: %w", err)
	}
	return nil
}

// Audit returns the newest limit actions, newest first.
func (s *Store) Audit(ctx context.Context, limit int) ([]AuditRecord, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT at, actor, action, source, status FROM audit ORDER BY at DESC, id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("store: audit: %w", err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var a AuditRecord
		var at int64
		if err := rows.Scan(&at, &a.Actor, &a.Action, &a.Source, &a.Status); err != nil {
			return nil, fmt.Errorf("store: audit: %w", err)
		}
		a.At = time.UnixMilli(at).UTC()
		out = append(out, a)
	}
	return out, rows.Err()
}
