package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// postgres is the PostgreSQL dialect (pgx through database/sql).
type postgres struct{}

func openPostgres(dsn string, maxConns int) (*sql.DB, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open postgres: %w", err)
	}
	if maxConns <= 0 {
		maxConns = 64
	}
	// Launches run one statement each, so every concurrent launch needs
	// its own connection; idle ones stay open to skip reconnect round trips.
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	return db, nil
}

// driverName keeps the pgx stdlib driver registered by importing it.
var _ = stdlib.GetDefaultDriver

func (postgres) name() string { return "postgres" }

// placeSQL is the whole placement in one statement: the user's live
// session in the group if any (reconnection), else the best eligible host,
// locked with SKIP LOCKED so concurrent launches take the next best instead
// of waiting, then the slot reserved and the session inserted. A concurrent
// launch for the same user trips the sessions_live unique index and the
// whole statement rolls back; running it again finds that session.
//
// $1 user, $2 group, $3 zone, $4 session id, $5 now, $6 stale cutoff,
// $7 personal, $8 depth.
const placeSQL = `WITH live AS (
    SELECT s.id, s.host_name FROM sessions s
    WHERE s.user_name = $1 AND s.group_name = $2 AND s.state <> 'ended' AND s.verified
    LIMIT 1
), mine AS (
    SELECT h.name FROM hosts h WHERE $7 AND h.group_name = $2 AND h.assigned_user = $1
), pick AS (
    SELECT h.name FROM hosts h
    WHERE NOT EXISTS (SELECT 1 FROM live)
      AND h.group_name = $2 AND h.last_seen >= $6 AND h.unhealthy = ''
      AND NOT h.admin_drain AND NOT h.agent_drain
      AND h.sessions < h.session_limit AND h.pending < h.logon_limit
      AND (NOT $7 OR h.assigned_user = $1 OR (h.assigned_user IS NULL AND NOT EXISTS (SELECT 1 FROM mine)))
    ORDER BY h.zone = $3 DESC,
      CASE WHEN $8 THEN -1 ELSE 1 END * floor(20 * GREATEST(h.sessions::float8 / h.session_limit, h.cpu, h.mem) / h.weight),
      h.pending, random()
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE hosts h SET sessions = h.sessions + 1, pending = h.pending + 1,
        assigned_user = CASE WHEN $7 THEN $1 ELSE h.assigned_user END
    FROM pick WHERE h.name = pick.name
    RETURNING h.name, h.address, h.port
), ins AS (
    INSERT INTO sessions (id, user_name, group_name, host_name, state, created_at, updated_at)
    SELECT $4, $1, $2, upd.name, 'launching', $5, $5 FROM upd
    RETURNING id, host_name
)
SELECT ins.id, upd.name, upd.address, upd.port, FALSE, TRUE FROM ins JOIN upd ON upd.name = ins.host_name
UNION ALL
SELECT live.id, h.name, h.address, h.port, TRUE, h.last_seen >= $6 FROM live JOIN hosts h ON h.name = live.host_name`

func (postgres) place(ctx context.Context, db *sql.DB, l Launch) (Placement, error) {
	var p Placement
	err := db.QueryRowContext(ctx, placeSQL, l.User, l.Group, l.Zone, l.SessionID, l.Now.UnixMilli(),
		l.Stale.UnixMilli(), l.Personal, l.Depth).Scan(&p.SessionID, &p.Host, &p.Address, &p.Port, &p.Reconnect, &p.HostAlive)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Placement{}, ErrNoHost
	case isUniqueViolation(err):
		return Placement{}, errRetry
	case err != nil:
		return Placement{}, fmt.Errorf("store: place: %w", err)
	}
	return p, nil
}

// eventSQL applies a session change and adjusts the host's counters in one
// statement. $1 host, $2 users, $3 new state, $4 now.
const eventSQL = `WITH old AS (
    SELECT id, state FROM sessions
    WHERE host_name = $1 AND user_name = ANY($2) AND state <> 'ended' AND state <> $3
    FOR UPDATE
), s AS (
    UPDATE sessions SET state = $3, updated_at = $4,
        logon_at = CASE WHEN $3 = 'active' THEN COALESCE(logon_at, $4) ELSE logon_at END,
        ended_at = CASE WHEN $3 = 'ended' THEN $4 ELSE ended_at END
    FROM old WHERE sessions.id = old.id
    RETURNING old.state AS was
)
UPDATE hosts SET pending = pending - (SELECT count(*) FROM s WHERE was = 'launching'),
    sessions = sessions - (SELECT count(*) FROM s WHERE $3 = 'ended')
WHERE name = $1 AND EXISTS (SELECT 1 FROM s)`

func (postgres) event(ctx context.Context, db *sql.DB, e Event) (bool, error) {
	res, err := db.ExecContext(ctx, eventSQL, e.Host, e.Users, e.State, e.Now.UnixMilli())
	if err != nil {
		return false, fmt.Errorf("store: session event: %w", err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// usageSQL sets the usage of a host's live sessions from three arrays
// read in step. $1 host, $2 users, $3 memory, $4 CPU.
const usageSQL = `UPDATE sessions s SET memory_bytes = u.mem, cpu = u.cpu
    FROM unnest($2::text[], $3::bigint[], $4::float8[]) AS u(user_name, mem, cpu)
    WHERE s.host_name = $1 AND s.user_name = u.user_name AND s.state <> 'ended'`

func (postgres) usage(ctx context.Context, db *sql.DB, host string, u []userUsage) error {
	users, mem, cpu := make([]string, len(u)), make([]int64, len(u)), make([]float64, len(u))
	for i, x := range u {
		users[i], mem[i], cpu[i] = x.user, x.memory, x.cpu
	}
	_, err := db.ExecContext(ctx, usageSQL, host, users, mem, cpu)
	return err
}

func (postgres) lockHost(ctx context.Context, tx *sql.Tx, host string) error {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM hosts WHERE name = $1 FOR UPDATE`, host).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("store: lock host %s: %w", host, err)
	}
	return nil
}

func (postgres) migrateLock(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(4242001)`)
	return err
}

func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// Conflict reports whether err is PostgreSQL ending a transaction that
// lost to another (a deadlock, or a serialization failure): nothing of
// it was written, and the same transaction run again may well succeed.
func Conflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}
