package store

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"
)

func (s *Store) liveSessions(ctx context.Context, q querier, host string) ([]Session, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, user_name, group_name, host_name, state, created_at, updated_at, verified, memory_bytes, cpu
		FROM sessions WHERE host_name = $1 AND state <> 'ended'`, host)
	if err != nil {
		return nil, fmt.Errorf("store: sessions of %s: %w", host, err)
	}
	return scanSessions(rows)
}

func scanSessions(rows *sql.Rows) ([]Session, error) {
	defer rows.Close()
	var out []Session
	for rows.Next() {
		var ss Session
		var created, updated int64
		var verified bool
		if err := rows.Scan(&ss.ID, &ss.User, &ss.Group, &ss.Host, &ss.State, &created, &updated, &verified, &ss.Memory, &ss.CPU); err != nil {
			return nil, fmt.Errorf("store: scan session: %w", err)
		}
		ss.CreatedAt, ss.UpdatedAt, ss.Unverified = time.UnixMilli(created), time.UnixMilli(updated), !verified
		out = append(out, ss)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: sessions: %w", err)
	}
	return out, nil
}

// query runs a read outside any transaction on db, from a prepared
// statement where the store keeps them.
func (s *Store) query(ctx context.Context, db *sql.DB, q string, args ...any) (*sql.Rows, error) {
	if s.stmts == nil {
		return db.QueryContext(ctx, q, args...)
	}
	st, err := s.stmts.get(ctx, db, q)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// queryRow is query for one row.
func (s *Store) queryRow(ctx context.Context, db *sql.DB, q string, args ...any) rowScanner {
	if s.stmts == nil {
		return db.QueryRowContext(ctx, q, args...)
	}
	st, err := s.stmts.get(ctx, db, q)
	if err != nil {
		return errRow{err}
	}
	return st.QueryRowContext(ctx, args...)
}

type rowScanner interface{ Scan(dest ...any) error }

// errRow is a row whose Scan reports why there is none.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// Sessions lists sessions, newest first: live only unless all is set, of
// one user when user is not empty, at most limit.
func (s *Store) Sessions(ctx context.Context, user string, all bool, limit int) ([]Session, error) {
	ss, _, err := s.sessionRows(ctx, SessionQuery{User: user, All: all, Limit: limit}, false)
	return ss, err
}

// sessionRows reads the sessions q selects, and their count when asked.
// The conditions are written out rather than "$1 = ” OR user_name = $1",
// which neither database can answer from an index.
func (s *Store) sessionRows(ctx context.Context, q SessionQuery, count bool) ([]Session, int, error) {
	var conds []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if q.User != "" {
		add("user_name = ?", q.User)
	}
	if q.Host != "" {
		add("host_name = ?", q.Host)
	}
	if !q.All {
		conds = append(conds, "state <> 'ended'")
	}
	if q.LoggedOn {
		conds = append(conds, "state IN ('active', 'disconnected')")
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	total := 0
	if count {
		if err := s.queryRow(ctx, s.read, `SELECT count(*) FROM sessions`+where, args...).Scan(&total); err != nil {
			return nil, 0, fmt.Errorf("store: sessions: %w", err)
		}
	}
	n := len(args)
	args = append(args, q.Limit, q.Offset)
	rows, err := s.query(ctx, s.read, `SELECT id, user_name, group_name, host_name, state, created_at, updated_at, verified, memory_bytes, cpu
		FROM sessions`+where+fmt.Sprintf(` ORDER BY created_at DESC, id LIMIT $%d OFFSET $%d`, n+1, n+2), args...)
	if err != nil {
		return nil, 0, fmt.Errorf("store: sessions: %w", err)
	}
	ss, err := scanSessions(rows)
	return ss, total, err
}

// SessionQuery selects a page of sessions, newest first.
type SessionQuery struct {
	User, Host string // empty: any
	All        bool   // ended ones too
	// LoggedOn keeps sessions a host has reported (active or
	// disconnected): not launches still waiting for their logon.
	LoggedOn bool
	Limit    int
	Offset   int
}

// SessionPage returns the sessions q selects and how many there are in
// all, for a list that pages.
func (s *Store) SessionPage(ctx context.Context, q SessionQuery) ([]Session, int, error) {
	return s.sessionRows(ctx, q, true)
}
