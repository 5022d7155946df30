package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

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
