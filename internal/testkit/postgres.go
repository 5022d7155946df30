package testkit

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/deskway/deskway/internal/pgcluster"
)

// Postgres is a real PostgreSQL cluster on loopback for one test (and its
// subtests), stopped and removed when the test ends.
type Postgres struct {
	*pgcluster.Cluster
	n atomic.Int64
}

// RequirePostgres stops the test when PostgreSQL is not installed (a
// failure in CI), for tests whose code under test starts its own cluster.
func RequirePostgres(t testing.TB) {
	t.Helper()
	if !pgcluster.Available() {
		missingThing(t, "PostgreSQL (the postgresql package)")
	}
}

// StartPostgres starts a cluster, or stops the test when PostgreSQL is not
// installed (a failure in CI).
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	RequirePostgres(t)
	c, err := pgcluster.Start(context.Background(), pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("postgres log:\n%s", tail(c.Log(), 30))
		}
		_ = c.Stop()
	})
	return &Postgres{Cluster: c}
}

// NewDB creates an empty database and returns its DSN.
func (p *Postgres) NewDB(t testing.TB) string {
	t.Helper()
	dsn, err := p.CreateDB(context.Background(), fmt.Sprintf("t%d", p.n.Add(1)), "")
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// LockTable takes lock (a LOCK TABLE mode, such as EXCLUSIVE) on table
// of the database at dsn, in a transaction of its own, as maintenance
// statements do: statements that need a conflicting lock wait while
// others, and pings, go on. The lock holds until release, or the end of
// the test.
func LockTable(t testing.TB, dsn, table, lock string) (release func()) {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("LOCK TABLE %s IN %s MODE", table, lock)); err != nil {
		_ = tx.Rollback()
		db.Close()
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(); db.Close() }) }
	t.Cleanup(release)
	return release
}
