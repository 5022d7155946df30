package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Command states. A command is pending until its host's next heartbeat
// takes it, sent until the agent answers, then done or failed. One that
// no agent took or answered within its time to live reads as expired.
const (
	CommandPending = "pending"
	CommandSent    = "sent"
	CommandDone    = "done"
	CommandFailed  = "failed"
	CommandExpired = "expired"
)

// ErrSessionEnded means a command was asked for a session that has ended.
var ErrSessionEnded = errors.New("store: the session has ended")

// Command is a session control command for a host's agent.
type Command struct {
	ID        string
	Host      string
	SessionID string
	User      string
	Kind      string
	Text      string
	State     string
	Error     string
	CreatedAt time.Time
}

// QueueCommand queues kind for the live session id on its host, for the
// host's agent to take with its next heartbeat.
func (s *Store) QueueCommand(ctx context.Context, sessionID, kind, text string, now time.Time) (Command, error) {
	c := Command{ID: NewID(), SessionID: sessionID, Kind: kind, Text: text, State: CommandPending, CreatedAt: now}
	var state string
	err := s.db.QueryRowContext(ctx, `SELECT host_name, user_name, state FROM sessions WHERE id = $1`, sessionID).Scan(&c.Host, &c.User, &state)
	if errors.Is(err, sql.ErrNoRows) {
		return Command{}, ErrNotFound
	}
	if err != nil {
		return Command{}, fmt.Errorf("store: queue %s: %w", kind, err)
	}
	if state == Ended {
		return Command{}, ErrSessionEnded
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO host_commands (id, host_name, session_id, user_name, kind, text, state, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7)`, c.ID, c.Host, c.SessionID, c.User, kind, text, now.UnixMilli()); err != nil {
		return Command{}, fmt.Errorf("store: queue %s: %w", kind, err)
	}
	return c, nil
}

// TakeCommands hands host's agent the commands queued for it since
// now-ttl, marking them sent: each is handed out once, and only while its
// session lives (the agent finds a session by its user, who may have
// logged on again since). A command whose session has ended fails.
func (s *Store) TakeCommands(ctx context.Context, host string, now time.Time, ttl time.Duration) ([]Command, error) {
	// One statement, as every heartbeat runs it: a command whose session
	// has ended (or moved) fails instead of being sent.
	rows, err := s.db.QueryContext(ctx, `UPDATE host_commands SET
		state = CASE WHEN live THEN 'sent' ELSE 'failed' END,
		sent_at = CAST($2 AS BIGINT),
		done_at = CASE WHEN live THEN NULL ELSE CAST($2 AS BIGINT) END,
		error = CASE WHEN live THEN '' ELSE 'the session ended before its host took the command' END
		FROM (SELECT c.id AS cid, EXISTS (SELECT 1 FROM sessions s WHERE s.id = c.session_id AND s.state <> 'ended' AND s.host_name = $1) AS live
			FROM host_commands c WHERE c.host_name = $1 AND c.state = 'pending' AND c.created_at > $3) AS due
		WHERE host_commands.id = due.cid
		RETURNING id, session_id, user_name, kind, text, created_at, state`, host, now.UnixMilli(), now.Add(-ttl).UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("store: commands for %s: %w", host, err)
	}
	defer rows.Close()
	var out []Command
	for rows.Next() {
		c := Command{Host: host}
		var created int64
		if err := rows.Scan(&c.ID, &c.SessionID, &c.User, &c.Kind, &c.Text, &created, &c.State); err != nil {
			return nil, fmt.Errorf("store: commands for %s: %w", host, err)
		}
		c.CreatedAt = time.UnixMilli(created).UTC()
		if c.State == CommandSent {
			out = append(out, c)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: commands for %s: %w", host, err)
	}
	return out, nil
}

// FinishCommand records host's agent's answer to a command it was sent:
// done when failure is empty, else failed with it. ErrNotFound when host
// (in its registration) was not sent such a command, or has answered it
// already.
func (s *Store) FinishCommand(ctx context.Context, host, registration, id, failure string, now time.Time) error {
	state := CommandDone
	if failure != "" {
		state = CommandFailed
	}
	// Only the host's current registration answers: a removed host's
	// credential outlives it.
	res, err := s.db.ExecContext(ctx, `UPDATE host_commands SET state = $3, error = $4, done_at = $5
		WHERE id = $1 AND host_name = $2 AND state = 'sent'
		AND EXISTS (SELECT 1 FROM hosts h WHERE h.name = $2 AND h.registration = $6)`, id, host, state, failure, now.UnixMilli(), registration)
	if err != nil {
		return fmt.Errorf("store: finish command %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// CommandByID returns a command; one pending or sent for longer than ttl
// reads as expired.
func (s *Store) CommandByID(ctx context.Context, id string, now time.Time, ttl time.Duration) (Command, error) {
	var c Command
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT id, host_name, session_id, user_name, kind, text, state, error, created_at
		FROM host_commands WHERE id = $1`, id).Scan(&c.ID, &c.Host, &c.SessionID, &c.User, &c.Kind, &c.Text, &c.State, &c.Error, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return Command{}, ErrNotFound
	}
	if err != nil {
		return Command{}, fmt.Errorf("store: command %s: %w", id, err)
	}
	c.CreatedAt = time.UnixMilli(created).UTC()
	if (c.State == CommandPending || c.State == CommandSent) && now.Sub(c.CreatedAt) > ttl {
		if c.State == CommandPending {
			c.Error = "the host's agent did not ask for it: the host is down or not reporting"
		} else {
			c.Error = "the host's agent took it but never answered"
		}
		c.State = CommandExpired
	}
	return c, nil
}

// PruneCommands deletes the commands created before before; it returns
// how many went.
func (s *Store) PruneCommands(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM host_commands WHERE created_at < $1`, before.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("store: prune commands: %w", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// SessionEnd returns the state of user's session id (ErrNotFound when
// there is none of theirs) and the kind of the newest logoff or
// disconnect its host's agent was handed for it since since ("" when
// none): what tells a session ended from outside from one its user left.
func (s *Store) SessionEnd(ctx context.Context, id, user string, since time.Time) (state, command string, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT state FROM sessions WHERE id = $1 AND user_name = $2`, id, user).Scan(&state)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", ErrNotFound
	}
	if err != nil {
		return "", "", fmt.Errorf("store: session end: %w", err)
	}
	err = s.db.QueryRowContext(ctx, `SELECT kind FROM host_commands WHERE session_id = $1 AND kind IN ('logoff', 'disconnect')
		AND state IN ('sent', 'done') AND created_at >= $2 ORDER BY created_at DESC LIMIT 1`, id, since.UnixMilli()).Scan(&command)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", "", fmt.Errorf("store: session end: %w", err)
	}
	return state, command, nil
}
