package store_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
)

// TestHeartbeatRecordsCPUPressure: each host's CPU pressure is what its
// own last report said, read back in the host list; a report without it
// (an older agent, or a kernel without PSI) sets it back to 0.
func TestHeartbeatRecordsCPUPressure(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		f := setup(t, open())
		f.host("h1", "desk", "", 10, 10)
		f.host("h2", "desk", "", 10, 10)
		f.beat("h1", store.Report{DiskIdle: 1, MemPressure: 0.25, CPUPressure: 0.875, Unhealthy: "cpu pressure 88% > 60%"})
		f.beat("h2", store.Report{DiskIdle: 1, CPUPressure: 0.125})
		hs := f.hosts()
		if h := hs["h1"]; h.CPUPressure != 0.875 || h.MemPressure != 0.25 || h.Unhealthy != "cpu pressure 88% > 60%" {
			t.Fatalf("h1 = cpu pressure %g, memory pressure %g, unhealthy %q; want 0.875, 0.25 and the report's reason",
				h.CPUPressure, h.MemPressure, h.Unhealthy)
		}
		if h := hs["h2"]; h.CPUPressure != 0.125 {
			t.Fatalf("h2's cpu pressure = %g, want 0.125", h.CPUPressure)
		}
		f.beat("h1", store.Report{DiskIdle: 1})
		if h := f.hosts()["h1"]; h.CPUPressure != 0 || h.Unhealthy != "" {
			t.Fatalf("h1 after a report without cpu pressure = %g, %q", h.CPUPressure, h.Unhealthy)
		}
		if h := f.hosts()["h2"]; h.CPUPressure != 0.125 {
			t.Fatalf("h2's cpu pressure after h1's report = %g, want 0.125", h.CPUPressure)
		}
	})
}

// TestCPUPressureMigrationKeepsRows migrates a database of the schema
// before CPU pressure (0009) that holds a host: it stays, reading 0, and
// takes CPU pressure from the next heartbeat.
func TestCPUPressureMigrationKeepsRows(t *testing.T) {
	eachDSN(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		f := setup(t, openStore(t, dsn))
		f.host("h1", "desk", "", 10, 10)
		f.s.Close()
		// Back to the schema before migration 10.
		driver := "sqlite"
		if strings.HasPrefix(dsn, "postgres") {
			driver = "pgx"
		}
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{`DELETE FROM schema_migrations WHERE version = 10`, `ALTER TABLE hosts DROP COLUMN cpu_pressure`} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		db.Close()
		s := openStore(t, dsn)
		hs, err := s.Hosts(ctx, "")
		if err != nil || len(hs) != 1 || hs[0].Name != "h1" || hs[0].CPUPressure != 0 {
			t.Fatalf("hosts after the migration: %+v, %v", hs, err)
		}
		if err := s.Heartbeat(ctx, store.Report{Host: "h1", DiskIdle: 1, CPUPressure: 0.5, Now: t0.Add(time.Second), LogonGrace: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if hs, _ := s.Hosts(ctx, ""); len(hs) != 1 || hs[0].CPUPressure != 0.5 {
			t.Fatalf("hosts after a heartbeat: %+v", hs)
		}
	})
}
