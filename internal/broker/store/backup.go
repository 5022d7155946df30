package store

// Backing up and restoring a broker's SQLite database. A backup is
// SQLite's own VACUUM INTO: one consistent snapshot taken in a read
// transaction, which a running broker's writes neither wait for nor
// tear. A restore copies a backup into place beside the database, as
// the database's directory's owner and group, and only while no broker
// holds the database's lock file, which a broker holds for as long as
// its store is open.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrInUse is Restore's refusal while a broker has the database open.
var ErrInUse = errors.New("a broker is running on this database")

// DatabaseMode is the mode of a restored database: its owner writes, its
// group (the broker's, in the package) reads.
const DatabaseMode = 0o640

// IsSQLite reports whether dsn names a SQLite file rather than a
// PostgreSQL database.
func IsSQLite(dsn string) bool {
	return !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://")
}

// SQLitePath is the file a SQLite dsn names.
func SQLitePath(dsn string) string { return strings.TrimPrefix(dsn, "sqlite://") }

// lockPath is the lock file beside the database at path.
func lockPath(path string) string { return path + ".lock" }

// lockSQLite takes the lock on the database at path, without waiting: a
// running broker holds it, so a restore cannot replace the file under
// it, and a second broker cannot share it.
func lockSQLite(path string) (*os.File, error) {
	f, err := os.OpenFile(lockPath(path), os.O_RDONLY|os.O_CREATE|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("store: lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("store: %s: %w (another process holds %s)", path, ErrInUse, lockPath(path))
		}
		return nil, fmt.Errorf("store: locking %s: %w", lockPath(path), err)
	}
	return f, nil
}

// Backup writes a consistent copy of the SQLite database at path to out,
// which must not exist, readable by its owner alone. The database may be
// in use by a running broker.
func Backup(ctx context.Context, path, out string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("store: backup: %w", err)
	}
	// VACUUM INTO writes an empty file it finds; creating it first makes
	// it the owner's alone and refuses to overwrite anything.
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("store: backup: %w", err)
	}
	f.Close()
	if err := vacuumInto(ctx, path, out); err != nil {
		os.Remove(out)
		return fmt.Errorf("store: backup: %w", err)
	}
	if err := check(ctx, out); err != nil {
		os.Remove(out)
		return fmt.Errorf("store: backup: %w", err)
	}
	return nil
}

// Restore puts the backup in place of the SQLite database at path. It
// refuses with ErrInUse while a broker has the database open. The
// restored file, and the lock file, belong to the owner and group of
// path's directory (the state directory), with DatabaseMode; the old
// database's write-ahead log is removed, so none of it is applied to the
// restored file.
func Restore(ctx context.Context, backup, path string) error {
	if _, err := os.Stat(backup); err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	owner, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("store: restore: cannot tell who owns " + dir)
	}
	lock, err := lockSQLite(path)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := chownIfRoot(lock.Name(), owner); err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".restore-*")
	if err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	tmp.Close()
	done := false
	defer func() {
		if !done {
			os.Remove(tmp.Name())
		}
	}()
	// Through SQLite rather than a file copy: whatever the backup's state
	// (a write-ahead log beside it), the result is one whole database.
	if err := vacuumInto(ctx, backup, tmp.Name()); err != nil {
		return fmt.Errorf("store: restore: %s is not a database deskway can read: %w", backup, err)
	}
	if err := check(ctx, tmp.Name()); err != nil {
		return fmt.Errorf("store: restore: %s: %w", backup, err)
	}
	if err := os.Chmod(tmp.Name(), DatabaseMode); err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	if err := chownIfRoot(tmp.Name(), owner); err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	if err := syncFile(tmp.Name()); err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	for _, stale := range []string{path + "-wal", path + "-shm", path + "-journal"} {
		if err := os.Remove(stale); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("store: restore: %w", err)
		}
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	done = true
	return syncFile(dir)
}

// vacuumInto writes the database at from into the empty file to.
func vacuumInto(ctx context.Context, from, to string) error {
	db, err := sql.Open("sqlite", "file:"+from+"?"+url.Values{"mode": {"ro"}, "_pragma": {"busy_timeout(10000)"}}.Encode())
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", to); err != nil {
		return err
	}
	return nil
}

// check opens the database at path read-only and wants it whole and a
// broker's: it passes SQLite's quick check and has had its migrations.
func check(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return err
	}
	defer db.Close()
	var res string
	if err := db.QueryRowContext(ctx, "PRAGMA quick_check").Scan(&res); err != nil {
		return fmt.Errorf("not a SQLite database: %w", err)
	}
	if res != "ok" {
		return fmt.Errorf("damaged: %s", res)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM schema_migrations").Scan(&n); err != nil || n == 0 {
		return errors.New("not a deskway broker's database (no schema_migrations)")
	}
	return nil
}

// chownIfRoot gives path to owner's user and group when this process may.
func chownIfRoot(path string, owner *syscall.Stat_t) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return os.Chown(path, int(owner.Uid), int(owner.Gid))
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
