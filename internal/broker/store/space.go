package store

import (
	"errors"
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
