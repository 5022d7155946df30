package store

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBackupAndRestoreRefusals: a backup of an open store holds its
// hosts and never overwrites a file; a restore is refused while a store
// has the database open, and refuses a file that is not a broker's
// database, leaving the database as it was.
func TestBackupAndRestoreRefusals(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := filepath.Join(dir, "broker.db")
	s, err := Open(ctx, db, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	if err := s.SyncGroups(ctx, []Group{{Name: "desk", Kind: "pooled", Spread: "breadth"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterHost(ctx, Host{Name: "h1", Group: "desk", Address: "h1.lan", Port: 3389, Weight: 1, SessionLimit: 10, LogonLimit: 10, RegisteredAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "backup.db")
	if err := Backup(ctx, db, out); err != nil {
		t.Fatalf("backup of an open store: %v", err)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the backup: %v %v, want mode 0600", st, err)
	}
	if err := Backup(ctx, db, out); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("a backup over an existing file: %v, want it refused", err)
	}
	if err := Restore(ctx, out, db); !errors.Is(err, ErrInUse) {
		t.Fatalf("a restore while the store is open: %v, want ErrInUse", err)
	}
	s.Close()
	junk := filepath.Join(dir, "junk.db")
	if err := os.WriteFile(junk, []byte("not a database"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Restore(ctx, junk, db); err == nil {
		t.Fatal("a file that is no database was restored")
	}
	if err := os.Remove(db); err != nil {
		t.Fatal(err)
	}
	if err := Restore(ctx, out, db); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(ctx, db, 0); err != nil {
		t.Fatal(err)
	}
	hosts, err := s.Hosts(ctx, "")
	if err != nil || len(hosts) != 1 || hosts[0].Name != "h1" {
		t.Fatalf("hosts after the restore: %v %v, want h1", hosts, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".broker.db.restore-*")); len(left) != 0 {
		t.Fatalf("the restore left %v behind", left)
	}
}
