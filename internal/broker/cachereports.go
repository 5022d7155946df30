package broker

// The local host cache's side of hosts' reports: heartbeats and the
// session lists they carry, applied to the copy online and offline.

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/deskway/deskway/internal/broker/store"
)

// heartbeat applies a host's report of load and health, which the
// database took, to the copy.
func (c *localCache) heartbeat(r store.Report) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loadLocked(r)
}

func (c *localCache) loadLocked(r store.Report) bool {
	h, ok := c.hosts[r.Host]
	if !ok {
		return false
	}
	h.CPU, h.Mem, h.DiskIdle, h.DiskLatency, h.MemPressure, h.CPUPressure = r.CPU, r.Mem, r.DiskIdle, r.DiskLatency, r.MemPressure, r.CPUPressure
	h.MajorFaults, h.SwapIn, h.SwapOut, h.SessionMemory = r.MajorFaults, r.SwapIn, r.SwapOut, r.SessionMemory()
	h.Unhealthy, h.AgentDrain, h.LastSeen = r.Unhealthy, r.Drain, r.Now
	c.hosts[r.Host] = h
	c.changedLocked(r.Host)
	return true
}

// offlineHeartbeat applies a host's report to the copy while the
// database is away, as the database would: sessions the host no longer
// has end, states change, launches unseen past the logon grace fail. A
// report that says something new of the host's sessions or health is
// journaled, to be written back in its turn; one that repeats the last
// (most of them) is not, so the journal grows with changes, not time.
func (c *localCache) offlineHeartbeat(r store.Report) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.admitLocked(r.Host, r.Registration); err != nil {
		return err
	}
	sig := reportSignature(r)
	if c.reported[r.Host] != sig || c.wouldReconcile(r) {
		if err := c.append(journalEntry{Report: &r}); err != nil {
			return err
		}
		c.reported[r.Host] = sig
	}
	c.reconcileLocked(r)
	return nil
}

// reportSignature is what a report says of sessions and health.
func reportSignature(r store.Report) string {
	users := slices.Sorted(maps.Keys(r.Sessions))
	var b strings.Builder
	for _, u := range users {
		b.WriteString(u + "=" + r.Sessions[u] + ";")
	}
	fmt.Fprintf(&b, "drain=%t;unhealthy=%s", r.Drain, r.Unhealthy)
	return b.String()
}

// wouldReconcile reports whether r would change the copy's sessions.
func (c *localCache) wouldReconcile(r store.Report) bool {
	for _, s := range c.live {
		if s.Host != r.Host {
			continue
		}
		st, ok := r.Sessions[s.User]
		if ok && st != s.State || !ok && (s.State != store.Launching || r.Now.Sub(s.CreatedAt) > r.LogonGrace) {
			return true
		}
	}
	return false
}

// reconcileLocked applies a report's load, health and sessions.
func (c *localCache) reconcileLocked(r store.Report) {
	if !c.loadLocked(r) {
		return
	}
	h := c.hosts[r.Host]
	for k, s := range c.live {
		if s.Host != r.Host {
			continue
		}
		st, ok := r.Sessions[s.User]
		if u, reported := r.Usage[s.User]; reported && ok {
			s.Memory, s.CPU = u.Memory, u.CPU
			c.live[k] = s
		}
		switch {
		case ok && st != s.State:
			c.changedLocked("", k)
			if s.State == store.Launching && h.Pending > 0 {
				h.Pending--
			}
			s.State, s.UpdatedAt = st, r.Now
			c.live[k] = s
		case !ok && (s.State != store.Launching || r.Now.Sub(s.CreatedAt) > r.LogonGrace):
			c.changedLocked("", k)
			if s.State == store.Launching && h.Pending > 0 {
				h.Pending--
			}
			if h.Sessions > 0 {
				h.Sessions--
			}
			delete(c.live, k)
		}
	}
	c.hosts[r.Host] = h
	c.learnReportedLocked(r)
}

// learnReportedLocked takes into the copy, while the database is away,
// the sessions a host reports that the copy does not hold. With several
// brokers these are most often sessions another broker placed (each
// journals its own launches, and reloads the others' from the database
// only now and then); holding them, this broker sends the user's next
// launch back to their session instead of placing a second one. The
// database cannot be asked which broker placed them, or their ids, so
// they carry none.
func (c *localCache) learnReportedLocked(r store.Report) {
	h, ok := c.hosts[r.Host]
	if !ok {
		return
	}
	for _, u := range slices.Sorted(maps.Keys(r.Sessions)) {
		k := liveKey(u, h.Group)
		if _, ok := c.live[k]; !ok {
			c.changedLocked("", k)
			c.live[k] = store.Session{User: u, Group: h.Group, Host: r.Host, State: r.Sessions[u], CreatedAt: r.Now, UpdatedAt: r.Now}
		}
	}
}

// unknown reports whether r names a session of its host that the copy
// does not hold.
func (c *localCache) unknown(r store.Report) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.hosts[r.Host]
	if !ok {
		return false
	}
	for u := range r.Sessions {
		if s, ok := c.live[liveKey(u, h.Group)]; !ok || s.Host != r.Host {
			return true
		}
	}
	return false
}

// learn adds to the copy the live sessions of ss it does not hold:
// another broker's placements, read from the database.
func (c *localCache) learn(ss []store.Session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range ss {
		k := liveKey(s.User, s.Group)
		if _, ok := c.live[k]; !ok && !s.Unverified && s.State != store.Ended {
			c.changedLocked("", k)
			c.live[k] = s
		}
	}
}

// learnEventLocked takes into the copy, while the database is away, a
// session an event reports live that the copy does not hold, as
// learnReportedLocked does a heartbeat's: with several brokers behind a
// load balancer, a host's report of a logon often reaches a broker that
// did not place the session, and holding it, that broker sends the
// user's next launch back to it instead of placing a second one before
// the host's next heartbeat reaches it. The session carries no id, as
// the database cannot be asked for it.
func (c *localCache) learnEventLocked(e store.Event) {
	h, ok := c.hosts[e.Host]
	if !ok || e.State == store.Ended || e.State == store.Launching {
		return
	}
	for _, u := range e.Users {
		k := liveKey(u, h.Group)
		if _, ok := c.live[k]; !ok {
			c.changedLocked("", k)
			c.live[k] = store.Session{User: u, Group: h.Group, Host: e.Host, State: e.State, CreatedAt: e.Now, UpdatedAt: e.Now}
		}
	}
}

// unknownEvent reports whether e names a user live on its host whose
// session the copy does not hold there: one another broker placed since
// the copy's last full reload.
func (c *localCache) unknownEvent(e store.Event) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.hosts[e.Host]
	if !ok || e.State == store.Ended {
		return false
	}
	for _, u := range e.Users {
		if s, ok := c.live[liveKey(u, h.Group)]; !ok || s.Host != e.Host {
			return true
		}
	}
	return false
}
