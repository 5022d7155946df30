package store

import (
	"context"
	"fmt"
	"time"
)

// LastUsed is, for each delivery group user has had a session in, when
// the newest change to one of those sessions was recorded: a launch, a
// logon or reconnection, a disconnection or the end. The portal lists a
// user's desktops most recently used first from it. It reads the session
// rows the broker keeps anyway (by the sessions_user index), so nothing
// is written for it; a host's removal takes its sessions, and so what
// they said of their groups' use, with it.
func (s *Store) LastUsed(ctx context.Context, user string) (map[string]time.Time, error) {
	rows, err := s.query(ctx, s.read, `SELECT group_name, MAX(updated_at) FROM sessions WHERE user_name = $1 GROUP BY group_name`, user)
	if err != nil {
		return nil, fmt.Errorf("store: last use of %s's desktops: %w", user, err)
	}
	defer rows.Close()
	used := map[string]time.Time{}
	for rows.Next() {
		var group string
		var at int64
		if err := rows.Scan(&group, &at); err != nil {
			return nil, fmt.Errorf("store: last use of %s's desktops: %w", user, err)
		}
		used[group] = time.UnixMilli(at)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: last use of %s's desktops: %w", user, err)
	}
	return used, nil
}
