package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// sqlite is the embedded dialect. SQLite has one writer at a time, so a
// launch is a short IMMEDIATE transaction on the only connection: nothing
// else can reserve a slot between its read and its write.
type sqlite struct{ stmts *stmtCache }

// openSQLite opens the one writing connection and a pool of read-only
// ones (query_only) beside it.
func openSQLite(path string) (write, read *sql.DB, err error) {
	if path == "" {
		return nil, nil, errors.New("store: empty SQLite path")
	}
	if dir := filepath.Dir(path); dir != "." {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("store: %w", err)
		}
	}
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Add("_pragma", "synchronous(NORMAL)")
	rq := url.Values{"_pragma": append(slices.Clone(q["_pragma"]), "query_only(ON)")}
	q.Set("_txlock", "immediate")
	write, err = sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, nil, fmt.Errorf("store: open SQLite %s: %w", path, err)
	}
	// One connection: writes serialize anyway, and a single writer never
	// waits on SQLite's busy handler.
	write.SetMaxOpenConns(1)
	if read, err = sql.Open("sqlite", "file:"+path+"?"+rq.Encode()); err != nil {
		write.Close()
		return nil, nil, fmt.Errorf("store: open SQLite %s: %w", path, err)
	}
	read.SetMaxOpenConns(sqliteReaders)
	read.SetMaxIdleConns(sqliteReaders)
	return write, read, nil
}

// sqliteReaders bounds the read-only connections: reads are short, and
// each connection holds its own page cache.
const sqliteReaders = 4

func (sqlite) name() string { return "sqlite" }

const sqliteLiveSQL = `SELECT s.id, h.name, h.address, h.port, h.last_seen >= $3
    FROM sessions s JOIN hosts h ON h.name = s.host_name
    WHERE s.user_name = $1 AND s.group_name = $2 AND s.state <> 'ended' AND s.verified LIMIT 1`

// $1 user, $2 group, $3 zone, $4 stale cutoff, $5 personal, $6 depth.
const sqlitePickSQL = `SELECT h.name, h.address, h.port FROM hosts h
    WHERE h.group_name = $2 AND h.last_seen >= $4 AND h.unhealthy = ''
      AND NOT h.admin_drain AND NOT h.agent_drain
      AND h.sessions < h.session_limit AND h.pending < h.logon_limit
      AND (NOT $5 OR h.assigned_user = $1 OR (h.assigned_user IS NULL AND NOT EXISTS
          (SELECT 1 FROM hosts m WHERE m.group_name = $2 AND m.assigned_user = $1)))
    ORDER BY h.zone = $3 DESC,
      CASE WHEN $6 THEN -1 ELSE 1 END * CAST(20 * MAX(CAST(h.sessions AS REAL) / h.session_limit, h.cpu, h.mem) / h.weight AS INTEGER),
      h.pending, random()
    LIMIT 1`

const sqliteTakeSQL = `UPDATE hosts SET sessions = sessions + 1, pending = pending + 1,
    assigned_user = CASE WHEN $2 THEN $3 ELSE assigned_user END WHERE name = $1`

const sqliteInsertSessionSQL = `INSERT INTO sessions (id, user_name, group_name, host_name, state, created_at, updated_at)
    VALUES ($1, $2, $3, $4, 'launching', $5, $5)`

func (d sqlite) place(ctx context.Context, db *sql.DB, l Launch) (Placement, error) {
	// Prepared before the transaction takes the only writing connection.
	var st [4]*sql.Stmt
	for i, q := range []string{sqliteLiveSQL, sqlitePickSQL, sqliteTakeSQL, sqliteInsertSessionSQL} {
		var err error
		if st[i], err = d.stmts.get(ctx, db, q); err != nil {
			return Placement{}, fmt.Errorf("store: place: %w", err)
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return Placement{}, fmt.Errorf("store: place: %w", err)
	}
	defer tx.Rollback()
	var p Placement
	err = tx.StmtContext(ctx, st[0]).QueryRowContext(ctx, l.User, l.Group, l.Stale.UnixMilli()).Scan(&p.SessionID, &p.Host, &p.Address, &p.Port, &p.HostAlive)
	if err == nil {
		p.Reconnect = true
		return p, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return Placement{}, fmt.Errorf("store: place: %w", err)
	}
	err = tx.StmtContext(ctx, st[1]).QueryRowContext(ctx, l.User, l.Group, l.Zone, l.Stale.UnixMilli(), l.Personal, l.Depth).Scan(&p.Host, &p.Address, &p.Port)
	if errors.Is(err, sql.ErrNoRows) {
		return Placement{}, ErrNoHost
	}
	if err != nil {
		return Placement{}, fmt.Errorf("store: place: %w", err)
	}
	if _, err := tx.StmtContext(ctx, st[2]).ExecContext(ctx, p.Host, l.Personal, l.User); err != nil {
		return Placement{}, fmt.Errorf("store: place: %w", err)
	}
	now := l.Now.UnixMilli()
	if _, err := tx.StmtContext(ctx, st[3]).ExecContext(ctx, l.SessionID, l.User, l.Group, p.Host, now); err != nil {
		return Placement{}, fmt.Errorf("store: place: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return Placement{}, fmt.Errorf("store: place: %w", err)
	}
	p.SessionID, p.HostAlive = l.SessionID, true
	return p, nil
}

func (d sqlite) event(ctx context.Context, db *sql.DB, e Event) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("store: session event: %w", err)
	}
	defer tx.Rollback()
	now := e.Now.UnixMilli()
	changed := false
	for _, u := range e.Users {
		res, err := tx.ExecContext(ctx, `UPDATE sessions SET state = $3, updated_at = $4,
			logon_at = CASE WHEN $3 = 'active' THEN COALESCE(logon_at, $4) ELSE logon_at END,
			ended_at = CASE WHEN $3 = 'ended' THEN $4 ELSE ended_at END
			WHERE host_name = $1 AND user_name = $2 AND state <> 'ended' AND state <> $3`, e.Host, u, e.State, now)
		if err != nil {
			return false, fmt.Errorf("store: session event: %w", err)
		}
		n, _ := res.RowsAffected()
		changed = changed || n > 0
	}
	if !changed {
		return false, nil
	}
	if err := recount(ctx, tx, e.Host); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// sqliteUsageSQL sets the usage of a host's live sessions from a JSON
// array of [user, memory, CPU]. $1 host, $2 the array.
const sqliteUsageSQL = `UPDATE sessions SET memory_bytes = u.mem, cpu = u.cpu
    FROM (SELECT json_extract(value, '$[0]') AS user_name, json_extract(value, '$[1]') AS mem,
        json_extract(value, '$[2]') AS cpu FROM json_each($2)) AS u
    WHERE sessions.host_name = $1 AND sessions.user_name = u.user_name AND sessions.state <> 'ended'`

func (d sqlite) usage(ctx context.Context, db *sql.DB, host string, u []userUsage) error {
	rows := make([][3]any, len(u))
	for i, x := range u {
		rows[i] = [3]any{x.user, x.memory, x.cpu}
	}
	arg, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	st, err := d.stmts.get(ctx, db, sqliteUsageSQL)
	if err != nil {
		return err
	}
	_, err = st.ExecContext(ctx, host, string(arg))
	return err
}

func (sqlite) lockHost(context.Context, *sql.Tx, string) error { return nil }

func (sqlite) migrateLock(context.Context, *sql.Tx) error { return nil }

// NewID returns a random 128-bit identifier in hex.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
