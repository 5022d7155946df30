package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestReadsRunBesideTheWriter: a read still open (a console page of
// sessions being scanned) does not hold up a launch, and the launch's
// statements come from the statement cache the second time. With reads
// on the one writing connection, the launch waited for the read to end.
func TestReadsRunBesideTheWriter(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "broker.db"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
	if err := s.SyncGroups(ctx, []Group{{Name: "desk", Kind: "pooled", Spread: "breadth"}}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2"} {
		if err := s.RegisterHost(ctx, Host{Name: h, Group: "desk", Address: h + ".lan", Port: 3389, Weight: 1, SessionLimit: 10, LogonLimit: 10, RegisteredAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := s.query(ctx, s.read, `SELECT name FROM hosts ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	if !rows.Next() {
		t.Fatal("no first host")
	}
	for i, user := range []string{"ann", "bob"} {
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := s.Place(lctx, Launch{User: user, Group: "desk", SessionID: NewID(), Now: now, Stale: now.Add(-time.Minute)})
		cancel()
		if err != nil {
			t.Fatalf("launch %d with a read open: %v", i+1, err)
		}
	}
	if !rows.Next() {
		t.Fatal("the open read lost its second host")
	}
	s.stmts.mu.Lock()
	cached := len(s.stmts.m)
	s.stmts.mu.Unlock()
	if cached != 5 { // the read and the launch's four statements, once each
		t.Fatalf("%d statements cached, want 5", cached)
	}
}
