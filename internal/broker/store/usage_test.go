package store_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
)

// TestHeartbeatRecordsUsage: a heartbeat's page rates and memory per
// session land on its host, and each session's memory and CPU on that
// session of that host, including a session the same report records.
func TestHeartbeatRecordsUsage(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		f := setup(t, open())
		f.host("h1", "desk", "", 10, 10)
		f.mustLaunch("ann")
		f.mustLaunch("bob")
		f.host("h2", "desk", "", 10, 10) // after the launches: both are on h1
		sessions := func(host string) map[string]store.Session {
			t.Helper()
			ss, _, err := f.s.SessionPage(ctx, store.SessionQuery{Host: host, Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			m := map[string]store.Session{}
			for _, s := range ss {
				m[s.User] = s
			}
			return m
		}
		// h1 reports its two users and carl, whom the broker did not
		// place: the report records carl's session, and his usage with
		// it. h2 reports ann too (a session it claims) and zed; its
		// figures must not reach h1's sessions.
		u1 := map[string]string{"ann": store.Active, "bob": store.Disconnected, "carl": store.Active}
		use1 := map[string]store.Usage{"ann": {Memory: 300 << 20, CPU: 0.5}, "bob": {Memory: 100 << 20, CPU: 0}, "carl": {Memory: 50 << 20, CPU: 0.125}}
		f.beat("h1", store.Report{DiskIdle: 1, MajorFaults: 12.5, SwapIn: 3, SwapOut: 40.25, Sessions: u1, Usage: use1})
		u2 := map[string]string{"ann": store.Active, "zed": store.Active}
		use2 := map[string]store.Usage{"ann": {Memory: 999 << 20, CPU: 3}, "zed": {Memory: 1 << 20, CPU: 0.01}}
		f.beat("h2", store.Report{DiskIdle: 1, Sessions: u2, Usage: use2})

		if h := f.hosts()["h1"]; h.MajorFaults != 12.5 || h.SwapIn != 3 || h.SwapOut != 40.25 || h.SessionMemory != 150<<20 {
			t.Fatalf("h1 = faults %g, swap in %g out %g, memory per session %d; want 12.5, 3, 40.25, %d",
				h.MajorFaults, h.SwapIn, h.SwapOut, h.SessionMemory, 150<<20)
		}
		for host, want := range map[string]map[string]store.Usage{"h1": use1, "h2": use2} {
			got := sessions(host)
			if len(got) != len(want) {
				t.Fatalf("%s has sessions %+v, want those of %v", host, got, want)
			}
			for user, u := range want {
				if s := got[user]; s.Memory != u.Memory || s.CPU != u.CPU {
					t.Fatalf("%s's session on %s = %d bytes, %g of a core; want %d, %g", user, host, s.Memory, s.CPU, u.Memory, u.CPU)
				}
			}
		}

		// The next report changes carl's figures only; an agent that
		// reports no page activity sets the host's back to 0.
		use1["carl"] = store.Usage{Memory: 60 << 20, CPU: 1.5}
		delete(use1, "bob") // and says nothing of bob's
		f.beat("h1", store.Report{DiskIdle: 1, Sessions: u1, Usage: use1})
		if got := sessions("h1"); got["carl"].Memory != 60<<20 || got["carl"].CPU != 1.5 || got["ann"].Memory != 300<<20 || got["bob"].Memory != 100<<20 {
			t.Fatalf("h1's sessions after the second report = %+v", got)
		}
		if h := f.hosts()["h1"]; h.MajorFaults != 0 || h.SwapIn != 0 || h.SwapOut != 0 {
			t.Fatalf("h1 after a report without page activity = %+v", h)
		}
		// An agent that reports no usage at all (an older one): no memory
		// per session on the host; the sessions keep their last figures.
		f.beat("h1", store.Report{DiskIdle: 1, Sessions: u1})
		if h := f.hosts()["h1"]; h.SessionMemory != 0 {
			t.Fatalf("h1's memory per session after a report without usage = %d", h.SessionMemory)
		}
		if s := sessions("h1")["carl"]; s.Memory != 60<<20 {
			t.Fatalf("carl after a report without usage = %+v", s)
		}
	})
}

// TestUsageMigrationKeepsRows migrates a database of the schema before
// usage (0008) that holds a host and a session: both stay, reading 0,
// and take usage from the next heartbeat.
func TestUsageMigrationKeepsRows(t *testing.T) {
	eachDSN(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		f := setup(t, openStore(t, dsn))
		f.host("h1", "desk", "", 10, 10)
		f.mustLaunch("ann")
		f.s.Close()
		// Back to the schema before migration 9.
		driver := "sqlite"
		if strings.HasPrefix(dsn, "postgres") {
			driver = "pgx"
		}
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{
			`DELETE FROM schema_migrations WHERE version = 9`,
			`ALTER TABLE hosts DROP COLUMN major_faults`, `ALTER TABLE hosts DROP COLUMN swap_in`,
			`ALTER TABLE hosts DROP COLUMN swap_out`, `ALTER TABLE hosts DROP COLUMN session_memory`,
			`ALTER TABLE sessions DROP COLUMN memory_bytes`, `ALTER TABLE sessions DROP COLUMN cpu`,
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		db.Close()
		s := openStore(t, dsn)
		hs, err := s.Hosts(ctx, "")
		if err != nil || len(hs) != 1 || hs[0].SessionMemory != 0 || hs[0].MajorFaults != 0 {
			t.Fatalf("hosts after the migration: %+v, %v", hs, err)
		}
		ss, err := s.Sessions(ctx, "ann", false, 10)
		if err != nil || len(ss) != 1 || ss[0].Memory != 0 || ss[0].CPU != 0 {
			t.Fatalf("ann's sessions after the migration: %+v, %v", ss, err)
		}
		if err := s.Heartbeat(ctx, store.Report{Host: "h1", DiskIdle: 1, SwapOut: 2, Now: t0.Add(time.Second), LogonGrace: time.Minute,
			Sessions: map[string]string{"ann": store.Active}, Usage: map[string]store.Usage{"ann": {Memory: 1 << 30, CPU: 0.25}}}); err != nil {
			t.Fatal(err)
		}
		if ss, _ := s.Sessions(ctx, "ann", false, 10); len(ss) != 1 || ss[0].Memory != 1<<30 || ss[0].CPU != 0.25 {
			t.Fatalf("ann's session after a heartbeat: %+v", ss)
		}
	})
}
