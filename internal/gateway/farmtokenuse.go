package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// farmTokenUses is TokenUses in the farm's PostgreSQL database
// (farm.database), so that a token opens its tunnels once in the whole
// farm, not once per node. Each use is one statement. A tunnel holds its
// token open under this node's id; the node renews that lease while the
// tunnel runs, so a token held by a node that died is free again after
// farmLease. When the database cannot be reached, the node counts uses
// in memory as a node alone does, logs it, and says so in a metric: a
// farm keeps working, with replay bounded per node meanwhile.
type farmTokenUses struct {
	pool  *pgxpool.Pool
	node  string
	max   int
	lease time.Duration
	log   *slog.Logger
	local *memTokenUses
	down  prometheus.Gauge

	mu   sync.Mutex
	open map[string]int // tokens this node holds open: tunnels per token
}

// farmLease is how long a token stays open for a node that stops
// renewing it; renewals come every third of it.
const farmLease = 90 * time.Second

const farmTokenSchema = `CREATE TABLE IF NOT EXISTS deskway_token_uses (
	id        text PRIMARY KEY,
	source    text NOT NULL,
	uses      integer NOT NULL,
	open_node text,
	open_seen timestamptz,
	expires   timestamptz NOT NULL
)`

// NewFarmTokenUses connects to the farm's database, creates its table if
// it is missing, and returns the record, renewing leases and pruning
// expired tokens until ctx ends. max is gateway.token_max_uses.
func NewFarmTokenUses(ctx context.Context, dsn string, max int, log *slog.Logger, reg prometheus.Registerer) (TokenUses, error) {
	pool, err := openFarmDB(ctx, dsn, "token-use", farmTokenSchema)
	if err != nil {
		return nil, err
	}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	t := &farmTokenUses{pool: pool, node: hex.EncodeToString(id), max: max, lease: farmLease, log: log,
		local: newMemTokenUses(max, nil), open: map[string]int{},
		down: prometheus.NewGauge(prometheus.GaugeOpts{Name: "deskway_gateway_farm_database_unreachable",
			Help: "1 while the farm's database cannot be reached: token uses are counted by this node alone."})}
	if reg != nil {
		reg.MustRegister(t.down)
	}
	go t.maintain(ctx)
	return t, nil
}

// Begin implements TokenUses.
func (t *farmTokenUses) Begin(id string, expires time.Time, source netip.Addr) (func(UseEnd), error) {
	if t.max == 0 {
		return func(UseEnd) {}, nil
	}
	if id == "" {
		return nil, errors.New("token has no id (jti), so its uses cannot be counted; mint a new one")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var uses int
	err := t.pool.QueryRow(ctx, `INSERT INTO deskway_token_uses (id, source, uses, open_node, open_seen, expires)
		VALUES ($1, $2, 1, $3, now(), $4)
		ON CONFLICT (id) DO UPDATE SET uses = deskway_token_uses.uses + 1, open_node = $3, open_seen = now()
		WHERE (deskway_token_uses.open_node IS NULL OR deskway_token_uses.open_seen < now() - $6::interval)
		  AND deskway_token_uses.source = $2 AND deskway_token_uses.uses < $5
		RETURNING uses`,
		id, source.String(), t.node, expires.Add(time.Minute), t.max, t.lease.String()).Scan(&uses)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, t.why(ctx, id, source)
	case err != nil:
		return t.offline(id, expires, source, err)
	}
	t.down.Set(0)
	t.mu.Lock()
	t.open[id]++
	t.mu.Unlock()
	return func(how UseEnd) { t.end(id, how) }, nil
}

// why explains a refused use from the token's row.
func (t *farmTokenUses) why(ctx context.Context, id string, source netip.Addr) error {
	var first string
	var uses int
	var openNode *string
	err := t.pool.QueryRow(ctx, `SELECT source, uses, open_node FROM deskway_token_uses WHERE id = $1`, id).Scan(&first, &uses, &openNode)
	switch {
	case err != nil:
		return fmt.Errorf("token use refused, and its record could not be read: %w", err)
	case uses > t.max:
		// end writes max+1 uses for a token an administrator cut off.
		return errRevoked
	case openNode != nil:
		return errors.New("token is in use by an open tunnel (on this gateway farm); a token opens one tunnel at a time")
	case first != source.String():
		return fmt.Errorf("token was first used from %s; it is not accepted from %s", first, source)
	default:
		return fmt.Errorf("token has opened the %d tunnels it may on this gateway farm (gateway.token_max_uses)", t.max)
	}
}

// offline counts the use in this node's memory while the database is
// unreachable.
func (t *farmTokenUses) offline(id string, expires time.Time, source netip.Addr, err error) (func(UseEnd), error) {
	t.down.Set(1)
	t.log.Warn("farm database unreachable: counting this token's use on this node only", "err", err)
	return t.local.Begin(id, expires, source)
}

func (t *farmTokenUses) end(id string, how UseEnd) {
	t.mu.Lock()
	if t.open[id]--; t.open[id] <= 0 {
		delete(t.open, id)
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A use whose channel never opened is given back whole; a token left
	// with no use is as new, bound to no address. A revoked token is
	// written past its limit, which why reads as revoked.
	_, err := t.pool.Exec(ctx, `UPDATE deskway_token_uses SET open_node = NULL, open_seen = NULL,
		uses = CASE $3::int WHEN 0 THEN uses - 1 WHEN 2 THEN $4::int + 1 ELSE uses END
		WHERE id = $1 AND open_node = $2`, id, t.node, int(how), t.max)
	if err == nil && how == UseUnopened {
		_, err = t.pool.Exec(ctx, `DELETE FROM deskway_token_uses WHERE id = $1 AND uses <= 0 AND open_node IS NULL`, id)
	}
	if err != nil {
		t.log.Warn("farm database: could not end a token's use; the token stays held until its lease runs out", "err", err, "lease", t.lease.String())
	}
}

// maintain renews the leases of tokens this node holds open and removes
// expired tokens, until ctx ends.
func (t *farmTokenUses) maintain(ctx context.Context) {
	defer t.pool.Close()
	tick := time.NewTicker(t.lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		ids := make([]string, 0, len(t.open))
		for id := range t.open {
			ids = append(ids, id)
		}
		t.mu.Unlock()
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := t.pool.Exec(qctx, `UPDATE deskway_token_uses SET open_seen = now() WHERE open_node = $1 AND id = ANY($2)`, t.node, ids)
		if err == nil {
			_, err = t.pool.Exec(qctx, `DELETE FROM deskway_token_uses WHERE expires < now()`)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			t.down.Set(1)
			t.log.Warn("farm database: renewing token leases failed", "err", err)
		}
	}
}
