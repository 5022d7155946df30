// Package store keeps the broker's state (delivery groups, hosts, sessions)
// in SQL: SQLite embedded by default, PostgreSQL when several brokers share
// one database. Both run the same embedded, forward-only migrations.
//
// Placement is the hot path and costs one database round trip on
// PostgreSQL: a single statement picks the least-loaded eligible host,
// skipping rows other launches hold, and reserves a slot on it under that
// row's lock only. Nothing locks a whole delivery group, so launches do not
// queue behind each other however far away the database is.
package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Session states.
const (
	Launching    = "launching"
	Active       = "active"
	Disconnected = "disconnected"
	Ended        = "ended"
)

// Group is a delivery group as the config defines it.
type Group struct {
	Name        string
	Kind        string // pooled or personal
	Spread      string // breadth or depth
	Description string
}

// Host is one session host as its agent registered it, with the load and
// health it last reported.
type Host struct {
	Name         string
	Group        string
	Zone         string
	Address      string
	Port         int
	Weight       float64
	SessionLimit int
	LogonLimit   int
	Sessions     int
	Pending      int
	CPU, Mem     float64 // 0..1
	DiskIdle     float64 // 0..1
	DiskLatency  float64 // milliseconds per request
	MemPressure  float64 // 0..1
	CPUPressure  float64 // 0..1, share of time runnable tasks waited for a CPU
	Unhealthy    string  // why the host takes no new sessions; empty when healthy
	AdminDrain   bool
	AgentDrain   bool
	AssignedUser string
	RegisteredAt time.Time
	LastSeen     time.Time
	// Registration identifies one join of the host: the agent's credential
	// names it, and a later join of the same name has another.
	Registration string
	// MajorFaults, SwapIn and SwapOut are pages per second.
	MajorFaults, SwapIn, SwapOut float64
	// SessionMemory is the average memory (Pss, bytes) of the sessions
	// the host last reported; 0 when its agent reports none.
	SessionMemory uint64
}

// Session is one user's session on a host.
type Session struct {
	ID        string
	User      string
	Group     string
	Host      string
	State     string
	CreatedAt time.Time
	UpdatedAt time.Time
	// Unverified marks a session its host reported that the broker did
	// not place; launches never reconnect to it.
	Unverified bool
	// Memory (Pss, bytes) and CPU (share of one core) are what the
	// session used as its host last reported; 0 until it reports them.
	Memory uint64
	CPU    float64
}

// Launch asks for a host for User in Group.
type Launch struct {
	User  string
	Group string
	// Zone is preferred; hosts elsewhere are taken only when none is free there.
	Zone      string
	Personal  bool // the group assigns each user one host for good
	Depth     bool // fill the most loaded host first instead of spreading
	SessionID string
	Now       time.Time
	// Stale is when a host's last heartbeat must be after to count as reachable.
	Stale time.Time
}

// Placement is where a launch goes.
type Placement struct {
	SessionID string
	Host      string
	Address   string
	Port      int
	// Reconnect is true when the user already had a live session there.
	Reconnect bool
	// HostAlive is false when that existing session's host stopped reporting.
	HostAlive bool
}

// ErrNoHost means no host can take the launch; Explain says why.
var ErrNoHost = errors.New("no host can take the launch")

// ErrNotFound means the named host or session does not exist.
var ErrNotFound = errors.New("not found")

// errRetry is a unique-index conflict with a concurrent launch for the same
// user; running the launch again finds that launch's session.
var errRetry = errors.New("concurrent launch for the same user")

// Report is what an agent says about its host in a heartbeat.
type Report struct {
	Host string
	// Registration is the one the agent's credential names.
	Registration string
	CPU, Mem     float64
	DiskIdle     float64
	DiskLatency  float64
	MemPressure  float64
	CPUPressure  float64
	Unhealthy    string
	Drain        bool
	// Sessions maps user to state (active or disconnected) on the host now.
	Sessions map[string]string
	Now      time.Time
	// LogonGrace is how long a launch may stay unseen on its host before
	// the report ends it as a failed logon.
	LogonGrace time.Duration
	// TrustSessions lets sessions the broker did not place draw their
	// users' launches (the delivery group's trust_host_sessions).
	TrustSessions bool
	// MajorFaults, SwapIn and SwapOut are pages per second.
	MajorFaults, SwapIn, SwapOut float64
	// Usage maps user to what the user's session uses, for the users of
	// Sessions whose usage the agent reported.
	Usage map[string]Usage `json:",omitempty"`
}

// Usage is what one session uses, as its host's agent reports it.
type Usage struct {
	Memory uint64  // bytes (Pss)
	CPU    float64 // share of one core since the agent's previous report
}

// SessionMemory is the average memory of the sessions r reports usage
// for, 0 when none.
func (r Report) SessionMemory() uint64 {
	if len(r.Usage) == 0 {
		return 0
	}
	var sum uint64
	for _, u := range r.Usage {
		sum += u.Memory
	}
	return sum / uint64(len(r.Usage))
}

// Event is a session change an agent reports as it happens, for one or
// more users of a host at once.
type Event struct {
	Host string
	// Registration is the one the agent's credential names.
	Registration string
	Users        []string
	State        string // active (logon or reconnect), disconnected, ended (logoff)
	Now          time.Time
}

// Store is the broker's database.
type Store struct {
	db *sql.DB
	// read answers the reads outside transactions. For SQLite it is a pool
	// of its own: the only writing connection is the launches' critical
	// resource, and in WAL mode readers run beside the writer and see every
	// committed transaction. For PostgreSQL it is db.
	read    *sql.DB
	dialect dialect
	// stmts holds prepared statements where the driver keeps none itself
	// (SQLite); nil for PostgreSQL.
	stmts *stmtCache
	// lock is held while a SQLite store is open, so that a restore
	// cannot replace the file under it; nil for PostgreSQL.
	lock *os.File
}

// dialect holds what differs between SQLite and PostgreSQL.
type dialect interface {
	name() string
	place(ctx context.Context, db *sql.DB, l Launch) (Placement, error)
	event(ctx context.Context, db *sql.DB, e Event) (bool, error)
	lockHost(ctx context.Context, tx *sql.Tx, host string) error
	// usage sets the memory and CPU of host's live sessions of the users
	// named, in one statement.
	usage(ctx context.Context, db *sql.DB, host string, u []userUsage) error
	migrateLock(ctx context.Context, tx *sql.Tx) error
}

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

// SyncGroups makes the delivery_groups table match the config's groups
// (insert or update; groups no longer configured stay while hosts use them).
func (s *Store) SyncGroups(ctx context.Context, groups []Group) error {
	for _, g := range groups {
		_, err := s.db.ExecContext(ctx, `INSERT INTO delivery_groups (name, kind, spread, description) VALUES ($1, $2, $3, $4)
			ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, spread = excluded.spread, description = excluded.description`,
			g.Name, g.Kind, g.Spread, g.Description)
		if err != nil {
			return fmt.Errorf("store: sync delivery group %s: %w", g.Name, err)
		}
	}
	return nil
}

// Errors of host registration.
var (
	ErrHostExists    = errors.New("store: a host of that name is registered")
	ErrJoinTokenUsed = errors.New("store: the join token has registered all the hosts it may")
)

// JoinHost adds a new host with a join token whose id is jti, counting a
// use of it when it allows at most maxUses (0: no limit). An existing
// name is ErrHostExists: a join token never takes over a registered host.
func (s *Store) JoinHost(ctx context.Context, h Host, jti string, maxUses int, expires time.Time) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: join host %s: %w", h.Name, err)
	}
	defer tx.Rollback()
	now := h.RegisteredAt.UnixMilli()
	res, err := tx.ExecContext(ctx, `INSERT INTO hosts (name, group_name, zone, address, port, weight, session_limit, logon_limit, registered_at, last_seen, registration)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10) ON CONFLICT (name) DO NOTHING`,
		h.Name, h.Group, h.Zone, h.Address, h.Port, h.Weight, h.SessionLimit, h.LogonLimit, now, h.Registration)
	if err != nil {
		return fmt.Errorf("store: join host %s: %w", h.Name, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return ErrHostExists
	}
	if maxUses > 0 {
		var uses int
		err := tx.QueryRowContext(ctx, `INSERT INTO join_token_uses (jti, uses, expires_at) VALUES ($1, 1, $3)
			ON CONFLICT (jti) DO UPDATE SET uses = join_token_uses.uses + 1 WHERE join_token_uses.uses < $2
			RETURNING uses`, jti, maxUses, expires.UnixMilli()).Scan(&uses)
		if errors.Is(err, sql.ErrNoRows) {
			return ErrJoinTokenUsed
		}
		if err != nil {
			return fmt.Errorf("store: join token use: %w", err)
		}
		// Spent tokens are forgotten once they could no longer verify.
		if _, err := tx.ExecContext(ctx, `DELETE FROM join_token_uses WHERE expires_at < $1`, now); err != nil {
			return fmt.Errorf("store: join token use: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: join host %s: %w", h.Name, err)
	}
	return nil
}

// UpdateHost changes the address, zone, weight and limits of host h.Name
// in group h.Group, as its own agent re-registers; ErrNotFound when no
// such host of that registration is in that group. Sessions and counters
// stay.
func (s *Store) UpdateHost(ctx context.Context, h Host) error {
	res, err := s.db.ExecContext(ctx, `UPDATE hosts SET zone = $3, address = $4, port = $5, weight = $6, session_limit = $7,
			logon_limit = $8, registered_at = $9, last_seen = $9 WHERE name = $1 AND group_name = $2 AND registration = $10`,
		h.Name, h.Group, h.Zone, h.Address, h.Port, h.Weight, h.SessionLimit, h.LogonLimit, h.RegisteredAt.UnixMilli(), h.Registration)
	if err != nil {
		return fmt.Errorf("store: update host %s: %w", h.Name, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return ErrNotFound
	}
	return nil
}

// RemoveHost deletes a host that has no live sessions the broker placed
// (sessions only its agent reported cannot keep it), so that a join token
// may register the name again; ErrNotFound if there is none.
func (s *Store) RemoveHost(ctx context.Context, name string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: remove host %s: %w", name, err)
	}
	defer tx.Rollback()
	var live int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE host_name = $1 AND state <> 'ended' AND verified`, name).Scan(&live); err != nil {
		return fmt.Errorf("store: remove host %s: %w", name, err)
	}
	if live > 0 {
		return fmt.Errorf("store: host %s has %d live sessions: drain it and wait for them to end", name, live)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE host_name = $1`, name); err != nil {
		return fmt.Errorf("store: remove host %s: %w", name, err)
	}
	// A replacement joining under the name must not inherit its commands.
	if _, err := tx.ExecContext(ctx, `DELETE FROM host_commands WHERE host_name = $1`, name); err != nil {
		return fmt.Errorf("store: remove host %s: %w", name, err)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM hosts WHERE name = $1`, name)
	if err != nil {
		return fmt.Errorf("store: remove host %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return ErrNotFound
	}
	return tx.Commit()
}

// RegisterHost adds a host or updates its address, zone, weight and limits;
// its sessions and counters survive a re-registration.
func (s *Store) RegisterHost(ctx context.Context, h Host) error {
	now := h.RegisteredAt.UnixMilli()
	_, err := s.db.ExecContext(ctx, `INSERT INTO hosts (name, group_name, zone, address, port, weight, session_limit, logon_limit, registered_at, last_seen)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
		ON CONFLICT (name) DO UPDATE SET group_name = excluded.group_name, zone = excluded.zone, address = excluded.address,
			port = excluded.port, weight = excluded.weight, session_limit = excluded.session_limit,
			logon_limit = excluded.logon_limit, registered_at = excluded.registered_at, last_seen = excluded.last_seen`,
		h.Name, h.Group, h.Zone, h.Address, h.Port, h.Weight, h.SessionLimit, h.LogonLimit, now)
	if err != nil {
		return fmt.Errorf("store: register host %s: %w", h.Name, err)
	}
	return nil
}

// Place picks and reserves a host for l, or returns the user's live session
// in the group. It returns ErrNoHost when no host qualifies.
func (s *Store) Place(ctx context.Context, l Launch) (Placement, error) {
	for attempt := 0; ; attempt++ {
		p, err := s.dialect.place(ctx, s.db, l)
		if errors.Is(err, errRetry) && attempt < 3 {
			continue
		}
		if err != nil {
			return Placement{}, err
		}
		if p.Reconnect && !p.HostAlive {
			// The session's host is gone: end the session and place anew.
			if _, err := s.EndSession(ctx, p.SessionID, l.Now); err != nil {
				return Placement{}, err
			}
			continue
		}
		return p, nil
	}
}

// EndSession marks a session ended and releases its slot. It reports
// whether the session was live.
func (s *Store) EndSession(ctx context.Context, id string, now time.Time) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("store: end session: %w", err)
	}
	defer tx.Rollback()
	var host, state string
	err = tx.QueryRowContext(ctx, `SELECT host_name, state FROM sessions WHERE id = $1`, id).Scan(&host, &state)
	if errors.Is(err, sql.ErrNoRows) {
		return false, ErrNotFound
	}
	if err != nil {
		return false, fmt.Errorf("store: end session: %w", err)
	}
	if state == Ended {
		return false, nil
	}
	if err := s.dialect.lockHost(ctx, tx, host); err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE sessions SET state = 'ended', updated_at = $2, ended_at = $2 WHERE id = $1`, id, now.UnixMilli()); err != nil {
		return false, fmt.Errorf("store: end session: %w", err)
	}
	if err := recount(ctx, tx, host); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// recount sets a host's counters from its sessions; the caller holds the
// host's row lock.
func recount(ctx context.Context, tx *sql.Tx, host string) error {
	_, err := tx.ExecContext(ctx, `UPDATE hosts SET
		sessions = (SELECT count(*) FROM sessions WHERE host_name = $1 AND state <> 'ended'),
		pending = (SELECT count(*) FROM sessions WHERE host_name = $1 AND state = 'launching')
		WHERE name = $1`, host)
	if err != nil {
		return fmt.Errorf("store: recount host %s: %w", host, err)
	}
	return nil
}

// Event applies a session change on a host: a logon or reconnect makes
// the users' sessions active, a disconnect disconnected, a logoff ended. It
// reports whether a session changed.
func (s *Store) Event(ctx context.Context, e Event) (bool, error) {
	switch e.State {
	case Active, Disconnected, Ended:
	default:
		return false, fmt.Errorf("store: event state %q is not active, disconnected or ended", e.State)
	}
	// The host must be the registration the events' credential is for: a
	// removed host's agent cannot report into the one that replaced it.
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM hosts WHERE name = $1 AND registration = $2`, e.Host, e.Registration).Scan(&n); err != nil {
		return false, fmt.Errorf("store: session event: %w", err)
	}
	if n == 0 {
		return false, ErrNotFound
	}
	return s.dialect.event(ctx, s.db, e)
}

// Heartbeat records a report's load and health and, when the sessions on
// the host differ from the database's, reconciles them: sessions the host
// no longer has end, sessions it has that the broker did not place are
// recorded, launches unseen past the logon grace end as failed. Then it
// records what the sessions use.
func (s *Store) Heartbeat(ctx context.Context, r Report) error {
	now := r.Now.UnixMilli()
	// last_seen never goes back: a report written back after an outage
	// is older than the ones that came since.
	res, err := s.db.ExecContext(ctx, `UPDATE hosts SET cpu = $2, mem = $3, disk_idle = $4, disk_latency = $5, mem_pressure = $6,
		unhealthy = $7, agent_drain = $8, last_seen = CASE WHEN last_seen > $9 THEN last_seen ELSE $9 END,
		major_faults = $11, swap_in = $12, swap_out = $13, session_memory = $14, cpu_pressure = $15 WHERE name = $1 AND registration = $10`,
		r.Host, r.CPU, r.Mem, r.DiskIdle, r.DiskLatency, r.MemPressure, r.Unhealthy, r.Drain, now, r.Registration,
		r.MajorFaults, r.SwapIn, r.SwapOut, bigint(r.SessionMemory()), r.CPUPressure)
	if err != nil {
		return fmt.Errorf("store: heartbeat %s: %w", r.Host, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	live, err := s.liveSessions(ctx, s.db, r.Host)
	if err != nil {
		return err
	}
	if needsReconcile(live, r) {
		if err := s.reconcile(ctx, r); err != nil {
			return err
		}
	}
	return s.recordUsage(ctx, r, live)
}

// recordUsage stores the sessions' usage where it differs from what live,
// the host's live sessions before the report, holds: an agent that
// reports none costs no write.
func (s *Store) recordUsage(ctx context.Context, r Report, live []Session) error {
	was := make(map[string]Usage, len(live))
	for _, ss := range live {
		was[ss.User] = Usage{Memory: ss.Memory, CPU: ss.CPU}
	}
	var changed []userUsage
	for user, u := range r.Usage {
		if old, ok := was[user]; !ok || old != u {
			changed = append(changed, userUsage{user: user, memory: bigint(u.Memory), cpu: u.CPU})
		}
	}
	if len(changed) == 0 {
		return nil
	}
	if err := s.dialect.usage(ctx, s.db, r.Host, changed); err != nil {
		return fmt.Errorf("store: usage of %s: %w", r.Host, err)
	}
	return nil
}

// userUsage is one user's session usage as a row takes it.
type userUsage struct {
	user   string
	memory int64
	cpu    float64
}

// bigint is v for a BIGINT column, which holds no more than MaxInt64.
func bigint(v uint64) int64 { return int64(min(v, math.MaxInt64)) }

// reconcile makes the host's live sessions those r reports: sessions the
// host no longer has end, sessions it has that the broker did not place
// are recorded, launches unseen past the logon grace end as failed.
func (s *Store) reconcile(ctx context.Context, r Report) error {
	now := r.Now.UnixMilli()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
	}
	defer tx.Rollback()
	if err := s.dialect.lockHost(ctx, tx, r.Host); err != nil {
		return err
	}
	var group string
	if err := tx.QueryRowContext(ctx, `SELECT group_name FROM hosts WHERE name = $1`, r.Host).Scan(&group); err != nil {
		return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
	}
	live, err := s.liveSessions(ctx, tx, r.Host)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, ss := range live {
		seen[ss.User] = true
		st, ok := r.Sessions[ss.User]
		switch {
		case ok && st != ss.State:
			_, err = tx.ExecContext(ctx, `UPDATE sessions SET state = $2, updated_at = $3,
				logon_at = COALESCE(logon_at, $3) WHERE id = $1`, ss.ID, st, now)
		case !ok && (ss.State != Launching || r.Now.Sub(ss.CreatedAt) > r.LogonGrace):
			_, err = tx.ExecContext(ctx, `UPDATE sessions SET state = 'ended', updated_at = $2, ended_at = $2 WHERE id = $1`, ss.ID, now)
		}
		if err != nil {
			return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
		}
	}
	for user, st := range r.Sessions {
		if seen[user] {
			continue
		}
		// A session the broker did not place (a direct logon, or a host
		// claiming a user). It takes a slot of the host either way; only a
		// group that trusts its hosts' reports lets it draw the user's
		// next launch, and then not over a session the user has elsewhere.
		if r.TrustSessions {
			var other int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE user_name = $1 AND group_name = $2 AND state <> 'ended' AND verified`, user, group).Scan(&other); err != nil {
				return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
			}
			if other > 0 {
				continue
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sessions (id, user_name, group_name, host_name, state, created_at, updated_at, logon_at, verified)
			VALUES ($1, $2, $3, $4, $5, $6, $6, $6, $7)`, NewID(), user, group, r.Host, st, now, r.TrustSessions); err != nil {
			return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
		}
	}
	if err := recount(ctx, tx, r.Host); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: reconcile %s: %w", r.Host, err)
	}
	return nil
}

// needsReconcile reports whether the host's reported sessions differ from
// the live ones recorded, ignoring launches still inside the logon grace.
func needsReconcile(live []Session, r Report) bool {
	seen := 0
	for _, ss := range live {
		st, ok := r.Sessions[ss.User]
		if ok {
			seen++
		}
		switch {
		case ok && st != ss.State:
			return true
		case !ok && (ss.State != Launching || r.Now.Sub(ss.CreatedAt) > r.LogonGrace):
			return true
		}
	}
	return seen != len(r.Sessions)
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (s *Store) liveSessions(ctx context.Context, q querier, host string) ([]Session, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, user_name, group_name, host_name, state, created_at, updated_at, verified, memory_bytes, cpu
		FROM sessions WHERE host_name = $1 AND state <> 'ended'`, host)
	if err != nil {
		return nil, fmt.Errorf("store: sessions of %s: %w", host, err)
	}
	return scanSessions(rows)
}

func scanSessions(rows *sql.Rows) ([]Session, error) {
	defer rows.Close()
	var out []Session
	for rows.Next() {
		var ss Session
		var created, updated int64
		var verified bool
		if err := rows.Scan(&ss.ID, &ss.User, &ss.Group, &ss.Host, &ss.State, &created, &updated, &verified, &ss.Memory, &ss.CPU); err != nil {
			return nil, fmt.Errorf("store: scan session: %w", err)
		}
		ss.CreatedAt, ss.UpdatedAt, ss.Unverified = time.UnixMilli(created), time.UnixMilli(updated), !verified
		out = append(out, ss)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: sessions: %w", err)
	}
	return out, nil
}

// query runs a read outside any transaction on db, from a prepared
// statement where the store keeps them.
func (s *Store) query(ctx context.Context, db *sql.DB, q string, args ...any) (*sql.Rows, error) {
	if s.stmts == nil {
		return db.QueryContext(ctx, q, args...)
	}
	st, err := s.stmts.get(ctx, db, q)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// queryRow is query for one row.
func (s *Store) queryRow(ctx context.Context, db *sql.DB, q string, args ...any) rowScanner {
	if s.stmts == nil {
		return db.QueryRowContext(ctx, q, args...)
	}
	st, err := s.stmts.get(ctx, db, q)
	if err != nil {
		return errRow{err}
	}
	return st.QueryRowContext(ctx, args...)
}

type rowScanner interface{ Scan(dest ...any) error }

// errRow is a row whose Scan reports why there is none.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// Sessions lists sessions, newest first: live only unless all is set, of
// one user when user is not empty, at most limit.
func (s *Store) Sessions(ctx context.Context, user string, all bool, limit int) ([]Session, error) {
	ss, _, err := s.sessionRows(ctx, SessionQuery{User: user, All: all, Limit: limit}, false)
	return ss, err
}

// sessionRows reads the sessions q selects, and their count when asked.
// The conditions are written out rather than "$1 = ” OR user_name = $1",
// which neither database can answer from an index.
func (s *Store) sessionRows(ctx context.Context, q SessionQuery, count bool) ([]Session, int, error) {
	var conds []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, strings.ReplaceAll(cond, "?", "$"+strconv.Itoa(len(args))))
	}
	if q.User != "" {
		add("user_name = ?", q.User)
	}
	if q.Host != "" {
		add("host_name = ?", q.Host)
	}
	if !q.All {
		conds = append(conds, "state <> 'ended'")
	}
	if q.LoggedOn {
		conds = append(conds, "state IN ('active', 'disconnected')")
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	total := 0
	if count {
		if err := s.queryRow(ctx, s.read, `SELECT count(*) FROM sessions`+where, args...).Scan(&total); err != nil {
			return nil, 0, fmt.Errorf("store: sessions: %w", err)
		}
	}
	n := len(args)
	args = append(args, q.Limit, q.Offset)
	rows, err := s.query(ctx, s.read, `SELECT id, user_name, group_name, host_name, state, created_at, updated_at, verified, memory_bytes, cpu
		FROM sessions`+where+fmt.Sprintf(` ORDER BY created_at DESC, id LIMIT $%d OFFSET $%d`, n+1, n+2), args...)
	if err != nil {
		return nil, 0, fmt.Errorf("store: sessions: %w", err)
	}
	ss, err := scanSessions(rows)
	return ss, total, err
}

// SessionQuery selects a page of sessions, newest first.
type SessionQuery struct {
	User, Host string // empty: any
	All        bool   // ended ones too
	// LoggedOn keeps sessions a host has reported (active or
	// disconnected): not launches still waiting for their logon.
	LoggedOn bool
	Limit    int
	Offset   int
}

// SessionPage returns the sessions q selects and how many there are in
// all, for a list that pages.
func (s *Store) SessionPage(ctx context.Context, q SessionQuery) ([]Session, int, error) {
	return s.sessionRows(ctx, q, true)
}

// Hosts lists the hosts of group, or of every group when group is empty.
func (s *Store) Hosts(ctx context.Context, group string) ([]Host, error) {
	rows, err := s.query(ctx, s.read, `SELECT name, group_name, zone, address, port, weight, session_limit, logon_limit,
		sessions, pending, cpu, mem, disk_idle, disk_latency, mem_pressure, unhealthy, admin_drain, agent_drain,
		COALESCE(assigned_user, ''), registered_at, last_seen, registration, major_faults, swap_in, swap_out, session_memory,
		cpu_pressure FROM hosts WHERE ($1 = '' OR group_name = $1) ORDER BY name`, group)
	if err != nil {
		return nil, fmt.Errorf("store: hosts: %w", err)
	}
	defer rows.Close()
	var out []Host
	for rows.Next() {
		var h Host
		var reg, seen int64
		if err := rows.Scan(&h.Name, &h.Group, &h.Zone, &h.Address, &h.Port, &h.Weight, &h.SessionLimit, &h.LogonLimit,
			&h.Sessions, &h.Pending, &h.CPU, &h.Mem, &h.DiskIdle, &h.DiskLatency, &h.MemPressure, &h.Unhealthy,
			&h.AdminDrain, &h.AgentDrain, &h.AssignedUser, &reg, &seen, &h.Registration, &h.MajorFaults, &h.SwapIn, &h.SwapOut,
			&h.SessionMemory, &h.CPUPressure); err != nil {
			return nil, fmt.Errorf("store: scan host: %w", err)
		}
		h.RegisteredAt, h.LastSeen = time.UnixMilli(reg), time.UnixMilli(seen)
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: hosts: %w", err)
	}
	return out, nil
}

// SetAdminDrain puts a host in or out of drain mode: a draining host keeps
// its sessions (and reconnections to them) but takes no new ones.
func (s *Store) SetAdminDrain(ctx context.Context, host string, drain bool) error {
	res, err := s.db.ExecContext(ctx, `UPDATE hosts SET admin_drain = $2 WHERE name = $1`, host, drain)
	if err != nil {
		return fmt.Errorf("store: drain %s: %w", host, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// Restore writes sessions placed while the database was unreachable (by
// this broker, from its local cache) and recounts their hosts. A session
// whose id is already stored is skipped; one that would give its user a
// second live session in the group (another broker placed them meanwhile)
// is stored as ended so that no record is lost. It returns how many
// sessions were stored live.
func (s *Store) Restore(ctx context.Context, sessions []Session, personal map[string]bool) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: restore: %w", err)
	}
	defer tx.Rollback()
	hosts := map[string]bool{}
	live := 0
	for _, ss := range sessions {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE id = $1`, ss.ID).Scan(&n); err != nil {
			return 0, fmt.Errorf("store: restore: %w", err)
		}
		if n > 0 {
			continue
		}
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE user_name = $1 AND group_name = $2 AND state <> 'ended'`,
			ss.User, ss.Group).Scan(&n); err != nil {
			return 0, fmt.Errorf("store: restore: %w", err)
		}
		state, ended := ss.State, any(nil)
		if n > 0 {
			state, ended = Ended, ss.UpdatedAt.UnixMilli()
		} else {
			live++
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sessions (id, user_name, group_name, host_name, state, created_at, updated_at, ended_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, ss.ID, ss.User, ss.Group, ss.Host, state,
			ss.CreatedAt.UnixMilli(), ss.UpdatedAt.UnixMilli(), ended); err != nil {
			return 0, fmt.Errorf("store: restore session %s: %w", ss.ID, err)
		}
		if personal[ss.Group] && state != Ended {
			if _, err := tx.ExecContext(ctx, `UPDATE hosts SET assigned_user = $2 WHERE name = $1 AND assigned_user IS NULL`, ss.Host, ss.User); err != nil {
				return 0, fmt.Errorf("store: restore: %w", err)
			}
		}
		hosts[ss.Host] = true
	}
	for h := range hosts {
		if err := s.dialect.lockHost(ctx, tx, h); err != nil {
			return 0, err
		}
		if err := recount(ctx, tx, h); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: restore: %w", err)
	}
	return live, nil
}

// AuditRecord is one administrator's action, as the audit table keeps it.
type AuditRecord struct {
	At     time.Time
	Actor  string
	Action string
	Source string
	Status int
}

// RecordAudit appends an administrator's action to the audit table.
func (s *Store) RecordAudit(ctx context.Context, a AuditRecord) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO audit (id, at, actor, action, source, status) VALUES ($1, $2, $3, $4, $5, $6)`,
		NewID(), a.At.UnixMilli(), a.Actor, a.Action, a.Source, a.Status); err != nil {
		return fmt.Errorf("store: audit: %w", err)
	}
	return nil
}

// Audit returns the newest limit actions, newest first.
func (s *Store) Audit(ctx context.Context, limit int) ([]AuditRecord, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT at, actor, action, source, status FROM audit ORDER BY at DESC, id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("store: audit: %w", err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var a AuditRecord
		var at int64
		if err := rows.Scan(&at, &a.Actor, &a.Action, &a.Source, &a.Status); err != nil {
			return nil, fmt.Errorf("store: audit: %w", err)
		}
		a.At = time.UnixMilli(at).UTC()
		out = append(out, a)
	}
	return out, rows.Err()
}
