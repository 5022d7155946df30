package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/testkit"
)

// TestFarmPruneKeepsADeadNodesTokensForTheirWindow: the record of a
// token past its expiry, held open by a node that died, stays while the
// window from the node's last beat runs (the client's reconnect through
// another node needs it), and goes once it is over.
func TestFarmPruneKeepsADeadNodesTokensForTheirWindow(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	u, err := NewFarmTokenUses(ctx, dsn, 3, 10*time.Minute, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := u.(*farmTokenUses)
	// Node A beats once, and never again: it is dead from then on.
	pool, err := openFarmDB(ctx, dsn, "token-use", farmTokenSchema)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	a := &farmTokenUses{pool: pool, node: "node-a", max: 3, window: 10 * time.Minute, log: log,
		local: newMemTokenUses(3, 10*time.Minute, nil), down: prometheus.NewGauge(prometheus.GaugeOpts{Name: "unused"})}
	if err := a.beat(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	src := netip.MustParseAddr("127.0.0.1")
	// Expired while its tunnel ran at node A.
	if _, err := a.Begin("tok", time.Now().Add(-2*time.Minute), src); err != nil {
		t.Fatal(err)
	}
	// Node A's last beat was 10 s ago.
	if _, err := db.Exec(ctx, `UPDATE deskway_gateway_nodes SET seen = now() - interval '10 seconds' WHERE node = $1`, a.node); err != nil {
		t.Fatal(err)
	}
	if err := b.prune(ctx); err != nil {
		t.Fatal(err)
	}
	end, err := b.Reconnect("tok", src)
	if err != nil {
		t.Fatalf("the reconnect at node B after node A died and node B pruned: %v", err)
	}
	end(UseEnded)
	// Closed at node B eleven minutes ago: past the window, pruned.
	if _, err := db.Exec(ctx, `UPDATE deskway_token_uses SET closed_at = now() - interval '11 minutes' WHERE id = 'tok'`); err != nil {
		t.Fatal(err)
	}
	if err := b.prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reconnect("tok", src); !errors.Is(err, errNoGrant) {
		t.Fatalf("the reconnect past the window: %v, want the record gone (%v)", err, errNoGrant)
	}
}
