package store

import (
	"context"
	"fmt"
	"math"
)

// Heartbeat records a report's load and health and, when the sessions on
// the host differ from the database's, reconciles them: sessions the host
// no longer has end, sessions it has that the broker did not place are
// recorded, launches unseen past the logon grace end as failed. Then it
// records what the sessions use.
func (s *Store) Heartbeat(ctx context.Context, r Report) error {
	now := r.Now.UnixMilli()
	// last_seen never goes back: a report written back after an outage
	// is older than the ones that came since.
	res, err := s.db.ExecContext(ctx, `UPDATE hosts SET cpu = $2, mem = $3, disk_idle = $4, disk_latency = $5, mem_pressure = $6,
		unhealthy = $7, agent_drain = $8, last_seen = CASE WHEN last_seen > $9 THEN last_seen ELSE $9 END,
		major_faults = $11, swap_in = $12, swap_out = $13, session_memory = $14, cpu_pressure = $15 WHERE name = $1 AND registration = $10`,
		r.Host, r.CPU, r.Mem, r.DiskIdle, r.DiskLatency, r.MemPressure, r.Unhealthy, r.Drain, now, r.Registration,
		r.MajorFaults, r.SwapIn, r.SwapOut, bigint(r.SessionMemory()), r.CPUPressure)
	if err != nil {
		return fmt.Errorf("store: heartbeat %s: %w", r.Host, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	live, err := s.liveSessions(ctx, s.db, r.Host)
	if err != nil {
		return err
	}
	if needsReconcile(live, r) {
		if err := s.reconcile(ctx, r); err != nil {
			return err
		}
	}
	return s.recordUsage(ctx, r, live)
}

// recordUsage stores the sessions' usage where it differs from what live,
// the host's live sessions before the report, holds: an agent that
// reports none costs no write.
func (s *Store) recordUsage(ctx context.Context, r Report, live []Session) error {
	was := make(map[string]Usage, len(live))
	for _, ss := range live {
		was[ss.User] = Usage{Memory: ss.Memory, CPU: ss.CPU}
	}
	var changed []userUsage
	for user, u := range r.Usage {
		if old, ok := was[user]; !ok || old != u {
			changed = append(changed, userUsage{user: user, memory: bigint(u.Memory), cpu: u.CPU})
		}
	}
	if len(changed) == 0 {
		return nil
	}
	if err := s.dialect.usage(ctx, s.db, r.Host, changed); err != nil {
		return fmt.Errorf("store: usage of %s: %w", r.Host, err)
	}
	return nil
}

// userUsage is one user's session usage as a row takes it.
type userUsage struct {
	user   string
	memory int64
	cpu    float64
}

// bigint is v for a BIGINT column, which holds no more than MaxInt64.
func bigint(v uint64) int64 { return int64(min(v, math.MaxInt64)) }

// reconcile makes the host's live sessions those r reports: sessions the
// host no longer has end, sessions it has that the broker did not place
// are recorded, launches unseen past the logon grace end as failed.
func (s *Store) reconcile(ctx context.Context, r Report) error {
	now := r.Now.UnixMilli()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
	}
	defer tx.Rollback()
	if err := s.dialect.lockHost(ctx, tx, r.Host); err != nil {
		return err
	}
	var group string
	if err := tx.QueryRowContext(ctx, `SELECT group_name FROM hosts WHERE name = $1`, r.Host).Scan(&group); err != nil {
		return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
	}
	live, err := s.liveSessions(ctx, tx, r.Host)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, ss := range live {
		seen[ss.User] = true
		if ss.UpdatedAt.UnixMilli() >= now {
			// The record changed after the report was made: the report
			// comes from an outage's journal, written back after another
			// broker wrote back later news of this session. Replayed over
			// it, the older report would end a session that had logged on.
			// A change in the report's own millisecond counts as later:
			// the record keeps no finer time, and an agent's heartbeat
			// and its next logon event can both fall in one (the bench's
			// link cut lost a launch so).
			continue
		}
		st, ok := r.Sessions[ss.User]
		switch {
		case ok && st != ss.State:
			_, err = tx.ExecContext(ctx, `UPDATE sessions SET state = $2, updated_at = $3,
				logon_at = COALESCE(logon_at, $3) WHERE id = $1`, ss.ID, st, now)
		case !ok && (ss.State != Launching || r.Now.Sub(ss.CreatedAt) > r.LogonGrace):
			_, err = tx.ExecContext(ctx, `UPDATE sessions SET state = 'ended', updated_at = $2, ended_at = $2 WHERE id = $1`, ss.ID, now)
		}
		if err != nil {
			return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
		}
	}
	for user, st := range r.Sessions {
		if seen[user] {
			continue
		}
		// Nor does an older report bring back a session that has ended
		// since it was made (or in its millisecond, as above).
		var newer int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE user_name = $1 AND group_name = $2 AND host_name = $3 AND updated_at >= $4`,
			user, group, r.Host, now).Scan(&newer); err != nil {
			return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
		}
		if newer > 0 {
			continue
		}
		// A session the broker did not place (a direct logon, or a host
		// claiming a user). It takes a slot of the host either way; only a
		// group that trusts its hosts' reports lets it draw the user's
		// next launch, and then not over a session the user has elsewhere.
		if r.TrustSessions {
			var other int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE user_name = $1 AND group_name = $2 AND state <> 'ended' AND verified`, user, group).Scan(&other); err != nil {
				return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
			}
			if other > 0 {
				continue
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sessions (id, user_name, group_name, host_name, state, created_at, updated_at, logon_at, verified)
			VALUES ($1, $2, $3, $4, $5, $6, $6, $6, $7)`, NewID(), user, group, r.Host, st, now, r.TrustSessions); err != nil {
			return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
		}
	}
	if err := recount(ctx, tx, r.Host); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
	}
	return nil
}

// needsReconcile reports whether the host's reported sessions differ from
// the live ones recorded, ignoring launches still inside the logon grace.
func needsReconcile(live []Session, r Report) bool {
	seen := 0
	for _, ss := range live {
		st, ok := r.Sessions[ss.User]
		if ok {
			seen++
		}
		switch {
		case ok && st != ss.State:
			return true
		case !ok && (ss.State != Launching || r.Now.Sub(ss.CreatedAt) > r.LogonGrace):
			return true
		}
	}
	return seen != len(r.Sessions)
}
