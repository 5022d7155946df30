package broker_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/testkit"
)

// TestWriteBackStepLosingADeadlockIsRunAgain: with several brokers
// writing their journals back at once, PostgreSQL ends one transaction of
// two that lock the same host and session in opposite orders (the broker
// scenario's logs show one such deadlock per broker per outage). The step
// that lost must be run again in place, not fail the write-back, which
// would start over from the top at the next tick and replay the whole
// journal. Here another transaction holds the session's row
// while the write-back's replay of a heartbeat holds its host's and waits
// for the session, then asks for the host: the replay is the deadlock's
// victim (the other waits 30 s before looking for one).
func TestWriteBackStepLosingADeadlockIsRunAgain(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWorld(t, "broker", dsn, []string{"h1"})
	placed := w.launch(t, "u1")
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The host reports the logon while the database is away: journaled.
	hb := brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9, Sessions: []brokerapi.Session{{User: "u1", State: store.Active}}}
	if _, err := w.r.client.Heartbeat(context.Background(), w.creds["h1"], hb); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SET LOCAL deadlock_timeout = '30s'`); err != nil {
		t.Fatal(err)
	}
	var one int
	if err := tx.QueryRowContext(ctx, `SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE`, placed.SessionID).Scan(&one); err != nil {
		t.Fatal(err)
	}
	// Only now may the write-back start: Maintain runs it.
	maintain(t, ctx, w.r.b)
	for deadline := time.Now().Add(30 * time.Second); ; {
		var waiting int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%UPDATE sessions%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the write-back never waited for the session's row:\n%s", w.r.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.QueryRowContext(ctx, `SELECT 1 FROM hosts WHERE name = 'h1' FOR UPDATE`).Scan(&one); err != nil {
		t.Fatalf("the transaction holding the session was ended, not the write-back's: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := w.settled(t); got["u1"] != store.Active {
		t.Errorf("u1's live sessions after the write-back: %v, want one, active", got)
	}
	logs := w.r.logs.String()
	if !strings.Contains(logs, "written back") {
		t.Fatalf("no write-back logged:\n%s", logs)
	}
	if strings.Contains(logs, "write-back of offline launches failed") {
		t.Errorf("the write-back failed on the deadlock and started over:\n%s", logs)
	}
}
