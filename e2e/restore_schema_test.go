package e2e

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the driver the broker uses

	"github.com/deskway/deskway/internal/testkit"
)

// TestRestoreRefusesATrigger: a backup someone added a trigger to (here
// one that deletes every host on the broker's next write to hosts) is
// refused by deskway restore, and the database stays as it was. A
// broker's migrations make no trigger or view.
func TestRestoreRefusesATrigger(t *testing.T) {
	bin, cfg, state := stoppedBroker(t)
	dir := filepath.Dir(cfg)
	backup := filepath.Join(dir, "backup.db")
	if out, err := exec.Command(bin, "backup", "-c", cfg, backup).CombinedOutput(); err != nil {
		t.Fatalf("backup: %v\n%s", err, out)
	}
	db, err := sql.Open("sqlite", backup)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec("CREATE TRIGGER wipe AFTER UPDATE ON hosts BEGIN DELETE FROM hosts; END")
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(state, "broker.db"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "restore", "-c", cfg, backup).CombinedOutput()
	if err == nil {
		t.Fatalf("a backup with a trigger was restored:\n%s", out)
	}
	if !strings.Contains(string(out), `trigger "wipe"`) {
		t.Fatalf("the refusal does not name the trigger:\n%s", out)
	}
	after, err := os.ReadFile(filepath.Join(state, "broker.db"))
	if err != nil || string(after) != string(before) {
		t.Fatalf("the refused restore changed the database (%v)", err)
	}
}

// TestBackupIntoAMissingDirectory: the documented line names
// /backup/broker.db; where there is no /backup, deskway backup says so
// in a sentence and how to make it.
func TestBackupIntoAMissingDirectory(t *testing.T) {
	bin, cfg, _ := stoppedBroker(t)
	missing := filepath.Join(t.TempDir(), "backup")
	out, err := exec.Command(bin, "backup", "-c", cfg, filepath.Join(missing, "broker.db")).CombinedOutput()
	if err == nil {
		t.Fatalf("a backup into a missing directory succeeded:\n%s", out)
	}
	want := "there is no directory " + missing + " to put broker.db in; make it"
	if !strings.Contains(string(out), want) || strings.Contains(string(out), "store:") {
		t.Fatalf("deskway backup into a missing directory said %q, want a sentence with %q", out, want)
	}
}

// stoppedBroker runs a broker alone on SQLite until it listens and stops
// it, leaving its database; it returns the binary, the config and the
// state directory.
func stoppedBroker(t *testing.T) (bin, cfg, state string) {
	t.Helper()
	bin = build(t)
	dir := t.TempDir()
	state = filepath.Join(dir, "state")
	adminPort, brokerPort := testkit.FreePort(t), testkit.FreePort(t)
	cfg = filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(backupConfig, state, adminPort, brokerPort)), 0o600); err != nil {
		t.Fatal(err)
	}
	broker := testkit.Start(t, nil, bin, "broker", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", brokerPort), 20*time.Second); err != nil {
		t.Fatalf("the broker did not listen: %v\n%s", err, broker.Log.String())
	}
	stopProcess(t, broker)
	return bin, cfg, state
}
