package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// farmTokenUses is TokenUses in the farm's PostgreSQL database
// (farm.database), so that a token opens its tunnels once in the whole
// farm, not once per node, and an expired token's reconnect is granted
// at any node. Each use is one statement. A tunnel holds its token open
// under this node's id, for as long as the node beats in the farm's
// list of nodes: the tokens of a node that died are free again, for the
// client's reconnect through another node, once its beat is farmNodeDead
// old. When the database cannot be reached, the node counts uses in
// memory as a node alone does, logs it, and says so in a metric: a farm
// keeps working, with replay bounded per node meanwhile.
type farmTokenUses struct {
	pool   *pgxpool.Pool
	node   string
	max    int
	window time.Duration
	log    *slog.Logger
	local  *memTokenUses
	down   prometheus.Gauge
}

const (
	// farmBeatEvery is how often a node writes that it lives.
	farmBeatEvery = time.Second
	// farmNodeDead is how old a node's last beat is when the tokens it
	// held open are free again: a few beats, so that a slow statement or
	// a busy database does not free a live node's tokens.
	farmNodeDead = 5 * time.Second
	// farmPruneEvery is how often in beats a node removes the records of
	// tokens past their expiry and reconnect window.
	farmPruneEvery = 30
)

// The node's beat (seen) and, in a token's row, when its last tunnel
// closed (closed_at), from which its reconnect window counts. Both are
// the database's clock, which every node shares.
const farmTokenSchema = `CREATE TABLE IF NOT EXISTS deskway_token_uses (
	id        text PRIMARY KEY,
	source    text NOT NULL,
	uses      integer NOT NULL,
	open_node text,
	open_seen timestamptz,
	expires   timestamptz NOT NULL
);
ALTER TABLE deskway_token_uses ADD COLUMN IF NOT EXISTS closed_at timestamptz;
CREATE TABLE IF NOT EXISTS deskway_gateway_nodes (
	node text PRIMARY KEY,
	seen timestamptz NOT NULL
)`

// farmHolderGone is true of a token row whose open_node does not beat
// ($1 is farmNodeDead): no node holds it open.
const farmHolderGone = `(deskway_token_uses.open_node IS NULL OR NOT EXISTS (SELECT 1 FROM deskway_gateway_nodes n
	WHERE n.node = deskway_token_uses.open_node AND n.seen > now() - $1::interval))`

// farmLastClose is when a token's last tunnel ended: when it closed, or
// for a tunnel on a node that died, the node's last beat.
const farmLastClose = `(CASE WHEN deskway_token_uses.open_node IS NULL THEN deskway_token_uses.closed_at
	ELSE COALESCE((SELECT n.seen FROM deskway_gateway_nodes n WHERE n.node = deskway_token_uses.open_node), deskway_token_uses.open_seen) END)`

// NewFarmTokenUses connects to the farm's database, creates its tables if
// they are missing, and returns the record, beating for this node and
// pruning expired tokens until ctx ends. max is gateway.token_max_uses,
// window gateway.reconnect_window.
func NewFarmTokenUses(ctx context.Context, dsn string, max int, window time.Duration, log *slog.Logger, reg prometheus.Registerer) (TokenUses, error) {
	pool, err := openFarmDB(ctx, dsn, "token-use", farmTokenSchema)
	if err != nil {
		return nil, err
	}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	t := &farmTokenUses{pool: pool, node: hex.EncodeToString(id), max: max, window: window, log: log,
		local: newMemTokenUses(max, window, nil),
		down: prometheus.NewGauge(prometheus.GaugeOpts{Name: "deskway_gateway_farm_database_unreachable",
			Help: "1 while the farm's database cannot be reached: token uses are counted by this node alone."})}
	// The node beats before it holds any token, or its first tunnels'
	// tokens would look free to the other nodes.
	if err := t.beat(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("farm.database: writing this node's beat: %w", err)
	}
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
		VALUES ($2, $3, 1, $4, now(), $5)
		ON CONFLICT (id) DO UPDATE SET uses = deskway_token_uses.uses + 1, open_node = $4, open_seen = now()
		WHERE `+farmHolderGone+`
		  AND deskway_token_uses.source = $3 AND deskway_token_uses.uses < $6
		RETURNING uses`,
		farmNodeDead.String(), id, source.String(), t.node, expires.Add(time.Minute), t.max).Scan(&uses)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, t.why(ctx, id, source)
	case err != nil:
		return t.offline(err, func() (func(UseEnd), error) { return t.local.Begin(id, expires, source) })
	}
	t.down.Set(0)
	return func(how UseEnd) { t.end(id, how) }, nil
}

// Reconnect implements TokenUses: the row must show a tunnel that
// opened (uses of at least one) and ended, not by an administrator
// (written past the limit), within the window.
func (t *farmTokenUses) Reconnect(id string, source netip.Addr) (func(UseEnd), error) {
	if t.max == 0 || t.window <= 0 {
		return nil, errNoGrant
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var uses int
	err := t.pool.QueryRow(ctx, `UPDATE deskway_token_uses SET uses = uses + 1, open_node = $4, open_seen = now()
		WHERE id = $2 AND source = $3 AND uses >= 1 AND uses < $5 AND `+farmHolderGone+`
		  AND `+farmLastClose+` > now() - $6::interval
		RETURNING uses`,
		farmNodeDead.String(), id, source.String(), t.node, t.max, t.window.String()).Scan(&uses)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, t.whyReconnect(ctx, id, source)
	case err != nil:
		return t.offline(err, func() (func(UseEnd), error) { return t.local.Reconnect(id, source) })
	}
	t.down.Set(0)
	return func(how UseEnd) { t.end(id, how) }, nil
}

// farmTokenRow is what a token's row says, to explain a refusal.
type farmTokenRow struct {
	source   string
	uses     int
	held     bool  // a live node holds it open
	inWindow *bool // its last tunnel ended within the reconnect window; nil: none ended
}

func (t *farmTokenUses) row(ctx context.Context, id string) (farmTokenRow, error) {
	var r farmTokenRow
	err := t.pool.QueryRow(ctx, `SELECT source, uses, NOT `+farmHolderGone+`, `+farmLastClose+` > now() - $3::interval
		FROM deskway_token_uses WHERE id = $2`, farmNodeDead.String(), id, t.window.String()).Scan(&r.source, &r.uses, &r.held, &r.inWindow)
	return r, err
}

// refusal says why r opens no tunnel from source, or nil.
func (t *farmTokenUses) refusal(r farmTokenRow, source netip.Addr) error {
	switch {
	case r.uses > t.max:
		// end writes max+1 uses for a token an administrator cut off.
		return errRevoked
	case r.held:
		return inUseError{" (on this gateway farm)"}
	case r.source != source.String():
		return fmt.Errorf("token was first used from %s; it is not accepted from %s", r.source, source)
	case r.uses >= t.max:
		return fmt.Errorf("token has opened the %d tunnels it may on this gateway farm (gateway.token_max_uses)", t.max)
	}
	return nil
}

// why explains a refused use from the token's row.
func (t *farmTokenUses) why(ctx context.Context, id string, source netip.Addr) error {
	r, err := t.row(ctx, id)
	if err != nil {
		return fmt.Errorf("token use refused, and its record could not be read: %w", err)
	}
	if err := t.refusal(r, source); err != nil {
		return err
	}
	return errors.New("token use refused: its record changed meanwhile; the client may try again")
}

// whyReconnect explains a refused reconnect from the token's row.
func (t *farmTokenUses) whyReconnect(ctx context.Context, id string, source netip.Addr) error {
	r, err := t.row(ctx, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return errNoGrant
	case err != nil:
		return fmt.Errorf("token reconnect refused, and its record could not be read: %w", err)
	}
	if err := t.refusal(r, source); err != nil {
		return err
	}
	switch {
	case r.uses < 1 || r.inWindow == nil:
		return errNoGrant
	case !*r.inWindow:
		return errGrantOver(t.window)
	}
	return errors.New("token reconnect refused: its record changed meanwhile; the client may try again")
}

// offline counts the use in this node's memory while the database is
// unreachable.
func (t *farmTokenUses) offline(err error, local func() (func(UseEnd), error)) (func(UseEnd), error) {
	t.down.Set(1)
	t.log.Warn("farm database unreachable: counting this token's use on this node only", "err", err)
	return local()
}

func (t *farmTokenUses) end(id string, how UseEnd) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A use whose channel never opened is given back whole; a token left
	// with no use is as new, bound to no address. A revoked token is
	// written past its limit, which why reads as revoked. A tunnel that
	// opened and ended starts the token's reconnect window.
	_, err := t.pool.Exec(ctx, `UPDATE deskway_token_uses SET open_node = NULL, open_seen = NULL,
		uses = CASE $3::int WHEN 0 THEN uses - 1 WHEN 2 THEN $4::int + 1 ELSE uses END,
		closed_at = CASE $3::int WHEN 1 THEN now() ELSE closed_at END
		WHERE id = $1 AND open_node = $2`, id, t.node, int(how), t.max)
	if err == nil && how == UseUnopened {
		_, err = t.pool.Exec(ctx, `DELETE FROM deskway_token_uses WHERE id = $1 AND uses <= 0 AND open_node IS NULL`, id)
	}
	if err != nil {
		t.log.Warn("farm database: could not end a token's use; the token stays held while this node lives", "err", err)
	}
}

// beat writes that this node lives.
func (t *farmTokenUses) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, farmBeatEvery)
	defer cancel()
	_, err := t.pool.Exec(ctx, `INSERT INTO deskway_gateway_nodes (node, seen) VALUES ($1, now())
		ON CONFLICT (node) DO UPDATE SET seen = now()`, t.node)
	return err
}

// maintain beats for this node and removes the records of tokens past
// their expiry and reconnect window, until ctx ends. A node that stops
// leaves its last beat: its tunnels have ended by then, and their
// reconnect windows count from them.
func (t *farmTokenUses) maintain(ctx context.Context) {
	defer t.pool.Close()
	tick := time.NewTicker(farmBeatEvery)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := t.beat(ctx)
		if err == nil && n%farmPruneEvery == 0 {
			err = t.prune(ctx)
		}
		if err != nil && ctx.Err() == nil {
			t.down.Set(1)
			t.log.Warn("farm database: writing this node's beat failed", "err", err)
		}
	}
}

// prune removes the records of tokens past their expiry and reconnect
// window, and of nodes gone for a day.
func (t *farmTokenUses) prune(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// A token whose node died keeps its row for the window from the
	// node's last beat, so its client's reconnect finds it.
	_, err := t.pool.Exec(ctx, `DELETE FROM deskway_token_uses WHERE expires < now() AND `+farmHolderGone+`
		AND (`+farmLastClose+` IS NULL OR `+farmLastClose+` < now() - $2::interval)`, farmNodeDead.String(), t.window.String())
	if err == nil {
		_, err = t.pool.Exec(ctx, `DELETE FROM deskway_gateway_nodes WHERE seen < now() - interval '1 day'`)
	}
	return err
}
