package cli

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestBrokerDatabaseReference: the commands that read broker.database
// (config validate, backup) take it from a file: or env: reference, as
// a Kubernetes Secret mounted as a file gives it, and never print the
// URL's password.
func TestBrokerDatabaseReference(t *testing.T) {
	const dsn = "postgres://deskway:pg-s3cret@db.example:5432/deskway?sslmode=require"
	dir := t.TempDir()
	dsnFile := filepath.Join(dir, "dsn")
	write(t, dsnFile, dsn+"\n")
	t.Setenv("DW_TEST_BROKER_DSN", dsn)
	cfg := func(database string) string {
		p := filepath.Join(t.TempDir(), "deskway.yaml")
		write(t, p, "state_dir: "+dir+"\nauth:\n  token_key: 0123456789abcdef0123456789abcdef\nbroker:\n  gateway: gw:443\n"+
			"  database: "+database+"\n  delivery_groups:\n  - {name: desk, groups: [staff]}\n")
		return p
	}

	for _, database := range []string{"file:" + dsnFile, "env:DW_TEST_BROKER_DSN", dsn} {
		code, out, errb := runMain(t, "config", "validate", cfg(database))
		if code != 0 || strings.Contains(out+errb, "pg-s3cret") || !strings.Contains(out, "db.example") && !strings.Contains(out, database) {
			t.Errorf("config validate with database %s: exit %d\n%s%s", database, code, out, errb)
		}
		// Resolved, the reference is PostgreSQL, which backup leaves to pg_dump.
		code, out, errb = runMain(t, "backup", "-c", cfg(database), filepath.Join(t.TempDir(), "copy.db"))
		if code == 0 || !strings.Contains(errb, "broker.database is PostgreSQL") || strings.Contains(out+errb, "pg-s3cret") {
			t.Errorf("backup with database %s: exit %d\n%s%s", database, code, out, errb)
		}
	}

	absent := filepath.Join(dir, "absent")
	code, _, errb := runMain(t, "config", "validate", cfg("file:"+absent))
	if want := "broker.database (line 6): secret file " + absent + " does not exist"; code == 0 || !strings.Contains(errb, want) {
		t.Errorf("config validate with a missing database file: exit %d, %q, want %q", code, errb, want)
	}
}
