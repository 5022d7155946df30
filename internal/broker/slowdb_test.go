package broker_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/testkit"
)

// TestLaunchDuringADatabaseStallIsToldToRetry holds PostgreSQL's sessions
// table locked (as a maintenance statement or autovacuum's truncation
// does) for longer than the broker waits on one statement, while the
// database goes on answering pings. This is how launches failed on a
// loaded machine in `deskway bench broker --mode e2e`: each got a 503
// reading "placement failed: store: place: context deadline exceeded",
// with no Retry-After, so clients gave up. A launch in the stall is
// told, in words, to try again with a Retry-After; a client that does
// gets its desktop once the lock goes, and the user has one session.
func TestLaunchDuringADatabaseStallIsToldToRetry(t *testing.T) {
	dsn := testkit.StartPostgres(t).NewDB(t)
	r := newRig(t, dsn, nil)
	r.agent("h1", "desk", "")

	release := testkit.LockTable(t, dsn, "sessions", "EXCLUSIVE")
	ctx := context.Background()

	alice := brokerclient.Basic("alice", "Alice-Pass-1")
	once := &brokerclient.Client{Base: r.client.Base, HTTP: r.client.HTTP}
	_, _, err := once.Launch(ctx, alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	var se *brokerclient.StatusError
	if !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable || se.RetryAfter == 0 {
		t.Fatalf("launch in the stall: %v, want 503 with a Retry-After", err)
	}
	for _, internal := range []string{"deadline", "store:", "context"} {
		if strings.Contains(se.Message, internal) {
			t.Errorf("the user reads %q, which names %q", se.Message, internal)
		}
	}
	if !strings.Contains(r.logs.String(), "context deadline exceeded") {
		t.Errorf("the log does not keep the cause:\n%s", r.logs.String())
	}

	// A client that retries, as brokerclient does, gets through once
	// the stall ends.
	time.AfterFunc(2*time.Second, release)
	res, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil {
		t.Fatalf("launch retried through the stall: %v", err)
	}
	if res.Host != "h1" {
		t.Fatalf("placed on %q", res.Host)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var live int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE user_name = 'alice' AND state <> 'ended'`).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if live != 1 {
		t.Errorf("alice has %d live sessions, want 1", live)
	}
}
