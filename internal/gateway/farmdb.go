package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// openFarmDB connects to the farm's database (farm.database) and creates
// table with schema if it is missing. Nodes starting at once take turns
// under the advisory lock farmSchemaLock, or both would create it.
func openFarmDB(ctx context.Context, dsn, table, schema string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("farm.database: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err = pgx.BeginFunc(cctx, poolTx{pool}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(cctx, `SELECT pg_advisory_xact_lock($1)`, farmSchemaLock); err != nil {
			return err
		}
		_, err := tx.Exec(cctx, schema)
		return err
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("farm.database: creating the %s table: %w", table, err)
	}
	return pool, nil
}

// farmSchemaLock is the advisory lock the farm's tables are created under.
const farmSchemaLock = 4242017

// poolTx lets pgx.BeginFunc start a transaction on the pool.
type poolTx struct{ p *pgxpool.Pool }

func (p poolTx) Begin(ctx context.Context) (pgx.Tx, error) { return p.p.Begin(ctx) }
