package store

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	msqlite "modernc.org/sqlite"
)

// NoSpace reports whether err says the database's disk is full: SQLite's
// SQLITE_FULL, PostgreSQL's disk_full (53100), or ENOSPC from a file.
// Nothing of the failed write was kept: SQLite and PostgreSQL roll the
// transaction back whole.
func NoSpace(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.ENOSPC) {
		return true
	}
	var se *msqlite.Error
	if errors.As(err, &se) && se.Code()&0xff == 13 { // SQLITE_FULL, with its extended codes
		return true
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "53100"
}

// Reclaim gives back to a SQLite database's disk the space its write-ahead
// log holds: a checkpoint that waits for readers and truncates the log.
// Under a steady stream of reads the log is never restarted by the
// automatic checkpoints, so it grows until the disk is full; and once it
// is, nothing written can shrink it again. A no-op for PostgreSQL, which
// manages its own files.
func (s *Store) Reclaim(ctx context.Context) error {
	if s.dialect.name() != "sqlite" {
		return nil
	}
	var busy, logPages, done int
	if err := s.db.QueryRowContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &logPages, &done); err != nil {
		return fmt.Errorf("store: checkpoint: %w", err)
	}
	if busy != 0 {
		return errors.New("store: checkpoint: readers kept the write-ahead log busy")
	}
	return nil
}
