package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
)

// stmtCache keeps one prepared statement per database and SQL text. The
// SQLite driver parses a statement's text on every call otherwise, and
// parsing was the largest part of a launch's time on the one writing
// connection. (pgx caches statements per connection by itself.)
//
// get must not be called while a transaction holds the writing
// connection: preparing needs that connection too.
type stmtCache struct {
	mu sync.Mutex
	m  map[stmtKey]*sql.Stmt
}

type stmtKey struct {
	db    *sql.DB
	query string
}

func newStmtCache() *stmtCache { return &stmtCache{m: map[stmtKey]*sql.Stmt{}} }

// get returns the statement for query on db, preparing it on first use.
func (c *stmtCache) get(ctx context.Context, db *sql.DB, query string) (*sql.Stmt, error) {
	k := stmtKey{db, query}
	c.mu.Lock()
	st := c.m[k]
	c.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev := c.m[k]; prev != nil {
		st.Close()
		return prev, nil
	}
	c.m[k] = st
	return st, nil
}

// close closes every statement.
func (c *stmtCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for k, st := range c.m {
		errs = append(errs, st.Close())
		delete(c.m, k)
	}
	return errors.Join(errs...)
}
