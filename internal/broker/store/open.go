package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Open connects to dsn and runs pending migrations. A dsn starting with
// postgres:// or postgresql:// is PostgreSQL; anything else is a SQLite
// file path (sqlite:// prefix optional).
func Open(ctx context.Context, dsn string, maxConns int) (*Store, error) {
	s, err := Connect(dsn, maxConns)
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Connect is Open without the migrations, and without a word to the
// database: nothing is sent before the first statement, so a broker can
// start while the database is down, and Migrate once it answers.
func Connect(dsn string, maxConns int) (*Store, error) {
	var s *Store
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		db, err := openPostgres(dsn, maxConns)
		if err != nil {
			return nil, err
		}
		s = &Store{db: db, read: db, dialect: postgres{}}
	default:
		path := SQLitePath(dsn)
		db, read, err := openSQLite(path)
		if err != nil {
			return nil, err
		}
		lock, err := lockSQLite(path)
		if err != nil {
			db.Close()
			read.Close()
			return nil, err
		}
		stmts := newStmtCache()
		s = &Store{db: db, read: read, dialect: sqlite{stmts: stmts}, stmts: stmts, lock: lock}
	}
	return s, nil
}

// Migrate applies the migrations the database has not had yet.
func (s *Store) Migrate(ctx context.Context) error { return s.migrate(ctx) }

// Close closes the database.
func (s *Store) Close() error {
	var err error
	if s.stmts != nil {
		err = s.stmts.close()
	}
	err = errors.Join(err, s.db.Close())
	if s.read != s.db {
		err = errors.Join(err, s.read.Close())
	}
	if s.lock != nil {
		err = errors.Join(err, s.lock.Close()) // after the database: the lock guards it
	}
	return err
}

// Dialect is "sqlite" or "postgres".
func (s *Store) Dialect() string { return s.dialect.name() }

// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// migrate applies, in order and each in its own transaction, every embedded
// migration not yet recorded in schema_migrations.
func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		return fmt.Errorf("store: create schema_migrations: %w", err)
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return fmt.Errorf("store: migration %s has no number prefix", base)
		}
		body, err := migrations.ReadFile(name)
		if err != nil {
			return err
		}
		if err := s.apply(ctx, v, base, string(body)); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) apply(ctx context.Context, version int, name, body string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: migration %s: %w", name, err)
	}
	defer tx.Rollback()
	// Brokers starting together must not apply the same migration twice.
	if err := s.dialect.migrateLock(ctx, tx); err != nil {
		return fmt.Errorf("store: migration lock: %w", err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE version = $1`, version).Scan(&n); err != nil {
		return fmt.Errorf("store: migration %s: %w", name, err)
	}
	if n > 0 {
		return nil
	}
	for _, stmt := range splitStatements(body) {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("store: migration %s: %w", name, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)`, version, time.Now().UnixMilli()); err != nil {
		return fmt.Errorf("store: migration %s: %w", name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: migration %s: %w", name, err)
	}
	return nil
}

// splitStatements cuts a migration at semicolons that end a line; the
// migrations hold no semicolons inside strings or bodies.
func splitStatements(body string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(body, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "--") || t == "" {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		out = append(out, cur.String())
	}
	return out
}
