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
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
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
// restored file, and a lock file it makes, belong to the owner and group
// of path's directory (the state directory), with DatabaseMode; the old
// database's write-ahead log is removed, so none of it is applied to the
// restored file.
//
// Run as root, it must not be led elsewhere by the state directory's
// owner (the broker's user), who can put a link at any name there at any
// time: the database is made in a directory of the caller's own, and in
// the state directory every file is opened beside a descriptor of it,
// never through a link, and is chmodded and chowned by its descriptor.
func Restore(ctx context.Context, backup, path string) error {
	if _, err := os.Stat(backup); err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	dir, base := filepath.Dir(path), filepath.Base(path)
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("store: restore: opening %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	var owner unix.Stat_t
	if err := unix.Fstat(dfd, &owner); err != nil {
		return fmt.Errorf("store: restore: %s: %w", dir, err)
	}
	lock, err := lockAt(dfd, dir, base+".lock", &owner)
	if err != nil {
		return err
	}
	defer lock.Close()

	work, err := os.MkdirTemp("", "deskway-restore-")
	if err != nil {
		return fmt.Errorf("store: restore: %w", err)
	}
	defer os.RemoveAll(work)
	made := filepath.Join(work, base)
	// Through SQLite rather than a file copy: whatever the backup's state
	// (a write-ahead log beside it), the result is one whole database.
	if err := vacuumInto(ctx, backup, made); err != nil {
		return fmt.Errorf("store: restore: %s is not a database deskway can read: %w", backup, err)
	}
	if err := check(ctx, made); err != nil {
		return fmt.Errorf("store: restore: %s: %w", backup, err)
	}
	tmpName := "." + base + ".restore-" + strconv.FormatUint(rand.Uint64(), 36)
	if err := copyInto(dfd, dir, tmpName, made, &owner); err != nil {
		_ = unix.Unlinkat(dfd, tmpName, 0)
		return fmt.Errorf("store: restore: %w", err)
	}
	for _, stale := range []string{base + "-wal", base + "-shm", base + "-journal"} {
		if err := unix.Unlinkat(dfd, stale, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			_ = unix.Unlinkat(dfd, tmpName, 0)
			return fmt.Errorf("store: restore: removing %s: %w", filepath.Join(dir, stale), err)
		}
	}
	if err := unix.Renameat(dfd, tmpName, dfd, base); err != nil {
		_ = unix.Unlinkat(dfd, tmpName, 0)
		return fmt.Errorf("store: restore: %w", err)
	}
	return unix.Fsync(dfd)
}

// lockAt takes the lock file name in the directory dfd (dir) without
// following a link there. One it makes is given to owner's user and
// group by its descriptor; one that exists is left as it is (a broker
// locks it read-only, whoever owns it).
func lockAt(dfd int, dir, name string, owner *unix.Stat_t) (*os.File, error) {
	path := filepath.Join(dir, name)
	created := true
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if errors.Is(err, unix.EEXIST) {
		created = false
		fd, err = unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	}
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("store: restore: %s is a symbolic link, which a broker never makes; remove it and restore again", path)
	}
	if err != nil {
		return nil, fmt.Errorf("store: restore: lock file %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fmt.Errorf("store: restore: %s is not a regular file; remove it and restore again", path)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("store: %s: %w (another process holds %s)", strings.TrimSuffix(path, ".lock"), ErrInUse, path)
		}
		return nil, fmt.Errorf("store: restore: locking %s: %w", path, err)
	}
	if created && os.Geteuid() == 0 {
		if err := f.Chown(int(owner.Uid), int(owner.Gid)); err != nil {
			f.Close()
			return nil, fmt.Errorf("store: restore: %w", err)
		}
	}
	return f, nil
}

// copyInto writes the file at from as the new file name in the
// directory dfd (dir), with DatabaseMode and, as root, owner's user and
// group, set by its descriptor, and synced.
func copyInto(dfd int, dir, name, from string, owner *unix.Stat_t) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Join(dir, name), err)
	}
	dst := os.NewFile(uintptr(fd), filepath.Join(dir, name))
	_, err = io.Copy(dst, src)
	if err == nil {
		err = dst.Chmod(DatabaseMode)
	}
	if err == nil && os.Geteuid() == 0 {
		err = dst.Chown(int(owner.Uid), int(owner.Gid))
	}
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	return err
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
	// The migrations make no trigger or view; one in a backup was put
	// there by someone else, and a trigger would run inside the
	// broker's own writes once it is restored.
	var kind, name string
	switch err := db.QueryRowContext(ctx, "SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view') LIMIT 1").Scan(&kind, &name); {
	case err == nil:
		return fmt.Errorf("not a deskway broker's database: it has the %s %q, which a broker never makes", kind, name)
	case !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("reading its schema: %w", err)
	}
	return nil
}
