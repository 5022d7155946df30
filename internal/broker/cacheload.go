package broker

// Reloading the local host cache from the database without undoing what
// this broker changed in the copy while the database was being read.

import "github.com/deskway/deskway/internal/broker/store"

// mark is the copy's change count now: a reload read from the database
// after it passes it to loadSince.
func (c *localCache) mark() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changes
}

// changedLocked counts a change to host and to the live sessions of keys.
func (c *localCache) changedLocked(host string, keys ...string) {
	c.changes++
	if host != "" {
		c.changedHosts[host] = c.changes
	}
	for _, k := range keys {
		c.changedLive[k] = c.changes
	}
}

// loadSince replaces the copy's hosts, and its sessions too when
// withSessions is set, with what the database held when it was read
// after mark. A user's session or a host this broker changed after mark
// keeps the copy's version: the database was read before the change, or
// while it was being written, so its rows may say what the change
// replaced — a session a user has since logged off from, or none where
// a launch has since placed one, which the user's next launch would act
// on if the database then became unreachable. A host kept so takes the
// later of the two heartbeat times; the rest of what other brokers
// changed in it arrives with the next reload.
func (c *localCache) loadSince(mark uint64, hosts []store.Host, sessions []store.Session, withSessions bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fresh := make(map[string]store.Host, len(hosts))
	for _, h := range hosts {
		fresh[h.Name] = h
	}
	for name, at := range c.changedHosts {
		if at <= mark {
			delete(c.changedHosts, name)
			continue
		}
		cur, had := c.hosts[name]
		read, ok := fresh[name]
		switch {
		case !had:
			delete(fresh, name)
		case ok && read.LastSeen.After(cur.LastSeen):
			cur.LastSeen = read.LastSeen
			fallthrough
		default:
			fresh[name] = cur
		}
	}
	c.hosts = fresh
	if !withSessions {
		for k, at := range c.changedLive {
			if at <= mark {
				delete(c.changedLive, k)
			}
		}
		return
	}
	live := make(map[string]store.Session, len(sessions))
	for _, s := range sessions {
		if !s.Unverified { // a host's unverified claim never draws a launch
			live[liveKey(s.User, s.Group)] = s
		}
	}
	for k, at := range c.changedLive {
		if at <= mark {
			delete(c.changedLive, k)
			continue
		}
		if cur, ok := c.live[k]; ok {
			live[k] = cur
		} else {
			delete(live, k)
		}
	}
	c.live = live
}
