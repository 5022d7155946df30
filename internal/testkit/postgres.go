package testkit

import (
	"context"
	"fmt"
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
