package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Entitlement is who may launch a delivery group as an administrator set
// it: it replaces the users and groups the configuration gives the group
// until it is cleared. Kept in the database, it reaches every broker that
// shares it.
type Entitlement struct {
	Group  string    `json:"delivery_group"`
	Users  []string  `json:"users"`
	Groups []string  `json:"groups"`
	SetBy  string    `json:"set_by"`
	SetAt  time.Time `json:"set_at"`
}

// SetEntitlement records e, replacing what was set for its group before.
// The group must be in the delivery_groups table.
func (s *Store) SetEntitlement(ctx context.Context, e Entitlement) error {
	users, _ := json.Marshal(nonNil(e.Users))
	groups, _ := json.Marshal(nonNil(e.Groups))
	_, err := s.db.ExecContext(ctx, `INSERT INTO entitlements (group_name, users, user_groups, set_by, set_at) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (group_name) DO UPDATE SET users = excluded.users, user_groups = excluded.user_groups, set_by = excluded.set_by, set_at = excluded.set_at`,
		e.Group, string(users), string(groups), e.SetBy, e.SetAt.UnixMilli())
	if err != nil {
		return fmt.Errorf("store: set entitlement of %s: %w", e.Group, err)
	}
	return nil
}

// ClearEntitlement removes what was set for group, so that its configured
// users and groups apply again; false when nothing was set.
func (s *Store) ClearEntitlement(ctx context.Context, group string) (bool, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM entitlements WHERE group_name = $1`, group)
	if err != nil {
		return false, fmt.Errorf("store: clear entitlement of %s: %w", group, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// Entitlements lists what administrators set, by group name.
func (s *Store) Entitlements(ctx context.Context) ([]Entitlement, error) {
	rows, err := s.query(ctx, s.read, `SELECT group_name, users, user_groups, set_by, set_at FROM entitlements ORDER BY group_name`)
	if err != nil {
		return nil, fmt.Errorf("store: entitlements: %w", err)
	}
	defer rows.Close()
	var out []Entitlement
	for rows.Next() {
		var e Entitlement
		var users, groups string
		var at int64
		if err := rows.Scan(&e.Group, &users, &groups, &e.SetBy, &at); err != nil {
			return nil, fmt.Errorf("store: entitlements: %w", err)
		}
		if err := json.Unmarshal([]byte(users), &e.Users); err != nil {
			return nil, fmt.Errorf("store: entitlement of %s: users: %w", e.Group, err)
		}
		if err := json.Unmarshal([]byte(groups), &e.Groups); err != nil {
			return nil, fmt.Errorf("store: entitlement of %s: groups: %w", e.Group, err)
		}
		e.SetAt = time.UnixMilli(at).UTC()
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: entitlements: %w", err)
	}
	return out, nil
}

func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}
