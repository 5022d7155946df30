// Package ha elects the active one of a pair of site gateways through a
// lease in PostgreSQL. The database's clock alone times the lease: a
// gateway takes it when it is free or expired, by that clock, and the
// holder renews it. A holder that cannot renew gives up its role before
// the lease can expire, so the two are never active together.
package ha

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Lease is one node's handle on its group's lease row.
type Lease struct {
	pool        *pgxpool.Pool
	group, node string
	ttl         time.Duration
}

// Previous is who held the lease before a node took it, and how it ended.
type Previous struct {
	// Holder is the node that held it; empty when none ever did.
	Holder string
	// Released tells a lease its holder gave back (it stopped) from one
	// that expired (it stopped renewing).
	Released bool
}

const schema = `CREATE TABLE IF NOT EXISTS site_ha_leases (
	grp text PRIMARY KEY,
	holder text NOT NULL DEFAULT '',
	expires timestamptz NOT NULL DEFAULT '-infinity'
)`

// Open connects to the database (lazily: a database that is down is
// retried at each attempt) and makes the lease table and the group's row
// if they are missing.
func Open(ctx context.Context, dsn, group, node string, ttl time.Duration) (*Lease, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("ha: database URL: %w", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("ha: database: %w", err)
	}
	return &Lease{pool: pool, group: group, node: node, ttl: ttl}, nil
}

// Close closes the connections.
func (l *Lease) Close() { l.pool.Close() }

// prepare makes the table and the group's row. Two nodes starting at once
// may race on CREATE TABLE IF NOT EXISTS, which PostgreSQL can fail with
// a unique violation on its catalogue: the loser tries again.
func (l *Lease) prepare(ctx context.Context) error {
	for range 3 {
		_, err := l.pool.Exec(ctx, schema)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" {
			continue
		}
		if err != nil {
			return fmt.Errorf("ha: create the lease table: %w", err)
		}
		break
	}
	if _, err := l.pool.Exec(ctx, `INSERT INTO site_ha_leases (grp) VALUES ($1) ON CONFLICT DO NOTHING`, l.group); err != nil {
		return fmt.Errorf("ha: the group's lease row: %w", err)
	}
	return nil
}

// Acquire takes or renews the lease for its ttl, by the database's clock.
// It reports whether this node holds it now, the holder it took it from
// (when it was another's or free), and the holder otherwise.
func (l *Lease) Acquire(ctx context.Context) (held bool, prev Previous, holder string, err error) {
	row := l.pool.QueryRow(ctx, `
		WITH old AS (SELECT holder, expires FROM site_ha_leases WHERE grp = $1 FOR UPDATE)
		UPDATE site_ha_leases l SET holder = $2, expires = now() + $3 * interval '1 microsecond'
		FROM old WHERE l.grp = $1 AND (old.holder = $2 AND old.expires >= now() OR old.expires < now())
		RETURNING old.holder, old.holder <> '' AND old.expires = '-infinity'`, l.group, l.node, l.ttl.Microseconds())
	switch err = row.Scan(&prev.Holder, &prev.Released); {
	case err == nil:
		if prev.Holder == l.node && !prev.Released {
			prev = Previous{Holder: l.node}
		}
		return true, prev, l.node, nil
	case errors.Is(err, pgx.ErrNoRows):
		err = l.pool.QueryRow(ctx, `SELECT holder FROM site_ha_leases WHERE grp = $1`, l.group).Scan(&holder)
		if errors.Is(err, pgx.ErrNoRows) {
			// The row went (someone deleted it): make it again.
			return false, Previous{}, "", l.prepare(ctx)
		}
		if err != nil {
			return false, Previous{}, "", fmt.Errorf("ha: read the lease: %w", err)
		}
		return false, Previous{}, holder, nil
	default:
		return false, Previous{}, "", fmt.Errorf("ha: take the lease: %w", err)
	}
}

// Release gives the lease back if this node holds it, so that the other
// takes it at its next attempt instead of after the ttl.
func (l *Lease) Release(ctx context.Context) error {
	if _, err := l.pool.Exec(ctx, `UPDATE site_ha_leases SET expires = '-infinity' WHERE grp = $1 AND holder = $2`, l.group, l.node); err != nil {
		return fmt.Errorf("ha: release the lease: %w", err)
	}
	return nil
}
