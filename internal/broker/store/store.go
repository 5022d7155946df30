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
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
)

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

// Errors of host registration.
var (
	ErrHostExists    = errors.New("store: a host of that name is registered")
	ErrJoinTokenUsed = errors.New("store: the join token has registered all the hosts it may")
)

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

// adoptReported takes over, for a session being restored, the record a
// host's report made of it: with several brokers, another broker's
// journal may be written back first, and its replayed heartbeats then
// store the host's session as one no broker placed (unverified). Left
// so, it would make the restored placement a second session of the user
// and end it: the launch's record would be lost. The reported record
// goes, and the restored one takes its state and logon time.
func adoptReported(ctx context.Context, tx *sql.Tx, ss Session) (state string, updated int64, logon any, err error) {
	state, updated, logon = ss.State, ss.UpdatedAt.UnixMilli(), nil
	var id, st string
	var at int64
	err = tx.QueryRowContext(ctx, `SELECT id, state, updated_at FROM sessions WHERE user_name = $1 AND group_name = $2 AND host_name = $3
		AND state <> 'ended' AND NOT verified LIMIT 1`, ss.User, ss.Group, ss.Host).Scan(&id, &st, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return state, updated, logon, nil
	}
	if err != nil {
		return "", 0, nil, fmt.Errorf("store: restore: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE id = $1`, id); err != nil {
		return "", 0, nil, fmt.Errorf("store: restore: %w", err)
	}
	return st, max(updated, at), at, nil
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Restore writes sessions placed while the database was unreachable (by
// this broker, from its local cache) and recounts their hosts. A session
// whose id is already stored on the same host is skipped (a write-back
// done twice), on another host replaced (replaceLate). One that would
// give its user a second live session in the group (another broker
// placed them meanwhile) is stored as ended so that no record is lost,
// unless its host reports the user logged on to it and the other is
// still launching (endUnused). It returns how many sessions were stored
// live.
func (s *Store) Restore(ctx context.Context, sessions []Session, personal map[string]bool) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: restore: %w", err)
	}
	defer tx.Rollback()
	// The hosts are locked first, in name order, as a heartbeat's
	// reconcile locks its host: another broker writing back its journal
	// at the same time then sees these sessions once they are stored,
	// or stores its host's report before adoptReported looks for it.
	var names []string
	for _, ss := range sessions {
		names = append(names, ss.Host)
	}
	slices.Sort(names)
	for _, h := range slices.Compact(names) {
		if err := s.dialect.lockHost(ctx, tx, h); err != nil {
			return 0, err
		}
	}
	hosts := map[string]bool{}
	live := 0
	for _, ss := range sessions {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE id = $1`, ss.ID).Scan(&n); err != nil {
			return 0, fmt.Errorf("store: restore: %w", err)
		}
		if n > 0 {
			moved, err := replaceLate(ctx, tx, ss)
			if err != nil {
				return 0, err
			}
			if moved == "" {
				continue
			}
			hosts[moved] = true
		}
		state, updated, logon, err := adoptReported(ctx, tx, ss)
		if err != nil {
			return 0, err
		}
		if logon != nil {
			freed, err := endUnused(ctx, tx, ss, updated)
			if err != nil {
				return 0, err
			}
			for _, h := range freed {
				hosts[h] = true
			}
		}
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE user_name = $1 AND group_name = $2 AND state <> 'ended' AND verified`,
			ss.User, ss.Group).Scan(&n); err != nil {
			return 0, fmt.Errorf("store: restore: %w", err)
		}
		ended := any(nil)
		if n > 0 {
			state, ended = Ended, ss.UpdatedAt.UnixMilli()
		} else {
			live++
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sessions (id, user_name, group_name, host_name, state, created_at, updated_at, ended_at, logon_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, ss.ID, ss.User, ss.Group, ss.Host, state,
			ss.CreatedAt.UnixMilli(), updated, ended, logon); err != nil {
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

// replaceLate deletes the stored record of ss's id when it names another
// host than ss, and returns that host. It is a placement the broker sent
// to the database and gave up on (the link was cut) before it placed the
// same launch, under the same id, from its local host cache: the
// statement reached the database later and ran there, but the user was
// told of ss.
func replaceLate(ctx context.Context, tx *sql.Tx, ss Session) (string, error) {
	var host string
	if err := tx.QueryRowContext(ctx, `SELECT host_name FROM sessions WHERE id = $1`, ss.ID).Scan(&host); err != nil {
		return "", fmt.Errorf("store: restore: %w", err)
	}
	if host == ss.Host {
		return "", nil
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE id = $1`, ss.ID); err != nil {
		return "", fmt.Errorf("store: restore: %w", err)
	}
	return host, nil
}

// endUnused ends the user's other live sessions in ss's group that are
// still launching, and returns their hosts: ss's host reports the user
// logged on to ss, so those are placements the user was never told of
// or never used (a broker finished one from its cache after the client
// had given up and tried another broker). Kept, the first would pass for
// the user's session and ss be stored as ended.
func endUnused(ctx context.Context, tx *sql.Tx, ss Session, at int64) ([]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, host_name FROM sessions WHERE user_name = $1 AND group_name = $2
		AND state = 'launching' AND verified AND id <> $3`, ss.User, ss.Group, ss.ID)
	if err != nil {
		return nil, fmt.Errorf("store: restore: %w", err)
	}
	var ids, hosts []string
	for rows.Next() {
		var id, host string
		if err := rows.Scan(&id, &host); err != nil {
			rows.Close()
			return nil, fmt.Errorf("store: restore: %w", err)
		}
		ids, hosts = append(ids, id), append(hosts, host)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: restore: %w", err)
	}
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, `UPDATE sessions SET state = 'ended', updated_at = $2, ended_at = $2 WHERE id = $1`, id, at); err != nil {
			return nil, fmt.Errorf("store: restore: %w", err)
		}
	}
	return hosts, nil
}

// Void deletes the records of placements a broker gave up on at the
// database and then answered from its local host cache with no session
// of that id (the user's session it knew of, or no host): sent before
// the link was cut, such a statement can reach the database later and
// store a session nobody was told of, which would pass for the user's
// own. Only a record still launching is deleted; its host is recounted.
// It returns how many it deleted.
func (s *Store) Void(ctx context.Context, ids []string) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: void: %w", err)
	}
	defer tx.Rollback()
	n := 0
	for _, id := range ids {
		var host string
		err := tx.QueryRowContext(ctx, `SELECT host_name FROM sessions WHERE id = $1 AND state = 'launching'`, id).Scan(&host)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("store: void: %w", err)
		}
		if err := s.dialect.lockHost(ctx, tx, host); err != nil {
			return 0, err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE id = $1`, id); err != nil {
			return 0, fmt.Errorf("store: void: %w", err)
		}
		if err := recount(ctx, tx, host); err != nil {
			return 0, err
		}
		n++
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: void: %w", err)
	}
	return n, nil
}
