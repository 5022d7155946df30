// Package pgcluster runs a throwaway PostgreSQL cluster on loopback from
// Debian's postgresql package: the real database the broker's tests and
// benchmarks use. It runs initdb in a fresh directory, starts the server on
// a free 127.0.0.1 port with its socket in that directory, and removes
// everything on Stop.
package pgcluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/deskway/deskway/internal/loopback"
)

// Options tune the cluster.
type Options struct {
	// Durable keeps fsync on, as a production server runs; tests turn it
	// off for speed (a killed server still keeps every commit).
	Durable bool
	// MaxConnections is the server's max_connections (default 300).
	MaxConnections int
}

// Cluster is a running PostgreSQL server.
type Cluster struct {
	dir, bin, data string
	port           int
	owner          *user.User
	opts           Options
}

// Available reports whether PostgreSQL's server binaries are installed.
func Available() bool {
	_, err := binDir()
	return err == nil
}

func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Strings(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("pgcluster: PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: install the postgresql package")
}

// Start creates and starts a cluster. PostgreSQL refuses to run as root,
// so under root the server runs as the postgres user.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 300
	}
	dir, err := os.MkdirTemp("", "deskway-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{dir: dir, bin: bin, data: filepath.Join(dir, "data"), opts: opts}
	if os.Geteuid() == 0 {
		if c.owner, err = user.Lookup("postgres"); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgcluster: running as root needs the postgres user (from the postgresql package): %w", err)
		}
		uid, _ := strconv.Atoi(c.owner.Uid)
		gid, _ := strconv.Atoi(c.owner.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	if out, err := c.run(ctx, "initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgcluster: initdb: %w\n%s", err, out)
	}
	if err := c.Restart(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

// run runs a PostgreSQL program as the cluster's owner.
func (c *Cluster) run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, prog), args...)
	cmd.Dir = c.dir
	if c.owner != nil {
		uid, _ := strconv.Atoi(c.owner.Uid)
		gid, _ := strconv.Atoi(c.owner.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Env = append(os.Environ(), "HOME="+c.dir)
	}
	return cmd.CombinedOutput()
}

// Restart starts the server (again, after Kill or Stop), on the same port
// when it had one.
func (c *Cluster) Restart(ctx context.Context) error {
	if c.port == 0 {
		p, err := loopback.FreePort()
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		c.port = p
	}
	o := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c max_connections=%d", c.port, c.dir, c.opts.MaxConnections)
	if !c.opts.Durable {
		// Commits still reach the OS before they are acknowledged, so a
		// killed server (Kill) keeps them; only a machine crash would not.
		o += " -c fsync=off -c full_page_writes=off"
	}
	if out, err := c.run(ctx, "pg_ctl", "-D", c.data, "-o", o, "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		return fmt.Errorf("pgcluster: start: %w\n%s\n%s", err, out, log)
	}
	return nil
}

// Kill stops the server at once, as a crash or a lost network would: open
// connections break and new ones are refused until Restart.
func (c *Cluster) Kill(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop"); err != nil {
		return fmt.Errorf("pgcluster: stop: %w\n%s", err, out)
	}
	return nil
}

// Stop stops the server and removes its files.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = c.run(ctx, "pg_ctl", "-D", c.data, "-m", "immediate", "-w", "stop")
	return os.RemoveAll(c.dir)
}

// Addr is the server's host:port.
func (c *Cluster) Addr() string { return fmt.Sprintf("127.0.0.1:%d", c.port) }

// DSN returns the connection string for database db.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", c.Addr(), db)
}

// SocketDSN is DSN(db) through the server's Unix socket instead of TCP:
// a path reaches the server from any network namespace.
func (c *Cluster) SocketDSN(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, c.dir, c.port)
}

// CreateDB creates database name, as a copy of template when it is not
// empty (a migrated template makes each test's fresh database cheap).
func (c *Cluster) CreateDB(ctx context.Context, name, template string) (string, error) {
	db, err := sql.Open("pgx", c.DSN("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgcluster: %w", err)
	}
	defer db.Close()
	q := fmt.Sprintf(`CREATE DATABASE %q`, name)
	if template != "" {
		q += fmt.Sprintf(` TEMPLATE %q`, template)
	}
	if _, err := db.ExecContext(ctx, q); err != nil {
		return "", fmt.Errorf("pgcluster: create database %s: %w", name, err)
	}
	return c.DSN(name), nil
}

// Log returns the server's log so far, for test failure messages.
func (c *Cluster) Log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	return string(b)
}
