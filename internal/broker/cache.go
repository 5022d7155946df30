package broker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
)

// localCache is the broker's local host cache: a copy of the hosts and
// live sessions, refreshed from the database and kept current by every
// placement, event and heartbeat that goes through this broker. While the
// database is unreachable the broker places launches from it, with the
// same rules, and appends each new session to a journal file (synced
// before the launch is answered) that is written back to the database when
// it returns, so no session record is lost. The copy itself is saved in
// the state directory as it changes, so that a broker that restarts while
// the database is down starts from it.
type localCache struct {
	mu       sync.Mutex
	hosts    map[string]store.Host
	live     map[string]store.Session // by user and group
	journal  string
	savePath string // where save writes the copy
	rnd      *rand.Rand
}

func liveKey(user, group string) string { return user + "\x00" + group }

func newLocalCache(journal, snapshot string) *localCache {
	return &localCache{hosts: map[string]store.Host{}, live: map[string]store.Session{}, journal: journal, savePath: snapshot,
		rnd: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x5eed))}
}

// cacheSnapshot is the local host cache as saved in the state directory.
type cacheSnapshot struct {
	Saved    time.Time       `json:"saved"`
	Hosts    []store.Host    `json:"hosts"`
	Sessions []store.Session `json:"sessions"`
}

// save writes the copy to its file, complete or not at all: a temporary
// file, synced, renamed over the old one.
func (c *localCache) save(now time.Time) error {
	c.mu.Lock()
	snap := cacheSnapshot{Saved: now.UTC(), Hosts: make([]store.Host, 0, len(c.hosts)), Sessions: make([]store.Session, 0, len(c.live))}
	for _, h := range c.hosts {
		snap.Hosts = append(snap.Hosts, h)
	}
	for _, ss := range c.live {
		snap.Sessions = append(snap.Sessions, ss)
	}
	c.mu.Unlock()
	b, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("broker: local host cache: %w", err)
	}
	tmp := c.savePath + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("broker: local host cache: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("broker: local host cache: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("broker: local host cache: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("broker: local host cache: %w", err)
	}
	if err := os.Rename(tmp, c.savePath); err != nil {
		return fmt.Errorf("broker: local host cache: %w", err)
	}
	return nil
}

// replay applies to the copy the sessions this broker's journals hold:
// launches placed while the database was down, before a restart. A user's
// session the copy has already is not counted twice.
func (c *localCache) replay() (int, error) {
	n := 0
	for _, path := range []string{c.journal + ".restoring", c.journal} {
		sessions, err := readJournal(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return n, err
		}
		c.mu.Lock()
		for _, ss := range sessions {
			k := liveKey(ss.User, ss.Group)
			if _, dup := c.live[k]; dup {
				continue
			}
			c.live[k] = ss
			if h, ok := c.hosts[ss.Host]; ok {
				h.Sessions++
				h.Pending++
				c.hosts[ss.Host] = h
			}
			n++
		}
		c.mu.Unlock()
	}
	return n, nil
}

// restoreSnapshot loads the copy a previous run saved.
func (c *localCache) restoreSnapshot() (cacheSnapshot, error) {
	var snap cacheSnapshot
	b, err := os.ReadFile(c.savePath)
	if err != nil {
		return snap, fmt.Errorf("broker: local host cache: %w", err)
	}
	if err := json.Unmarshal(b, &snap); err != nil {
		return snap, fmt.Errorf("broker: local host cache %s: %w", c.savePath, err)
	}
	c.load(snap.Hosts, snap.Sessions, true)
	return snap, nil
}

// load replaces the copy's hosts, and its sessions too when withSessions
// is set, with what the database holds.
func (c *localCache) load(hosts []store.Host, sessions []store.Session, withSessions bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hosts = make(map[string]store.Host, len(hosts))
	for _, h := range hosts {
		c.hosts[h.Name] = h
	}
	if !withSessions {
		return
	}
	c.live = make(map[string]store.Session, len(sessions))
	for _, s := range sessions {
		if !s.Unverified { // a host's unverified claim never draws a launch
			c.live[liveKey(s.User, s.Group)] = s
		}
	}
}

// placed records a placement the database made.
func (c *localCache) placed(l store.Launch, p store.Placement) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.Reconnect {
		return
	}
	if h, ok := c.hosts[p.Host]; ok {
		h.Sessions++
		h.Pending++
		if l.Personal {
			h.AssignedUser = l.User
		}
		c.hosts[p.Host] = h
	}
	c.live[liveKey(l.User, l.Group)] = store.Session{ID: p.SessionID, User: l.User, Group: l.Group, Host: p.Host,
		State: store.Launching, CreatedAt: l.Now, UpdatedAt: l.Now}
}

// place is placement without the database: the user's live session if
// any, else a host by Pick, journaled before it is returned.
func (c *localCache) place(l store.Launch) (store.Placement, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.live[liveKey(l.User, l.Group)]; ok {
		if h, ok := c.hosts[s.Host]; ok && !h.LastSeen.Before(l.Stale) {
			return store.Placement{SessionID: s.ID, Host: h.Name, Address: h.Address, Port: h.Port, Reconnect: true, HostAlive: true}, nil
		}
	}
	hosts := make([]store.Host, 0, len(c.hosts))
	for _, h := range c.hosts {
		hosts = append(hosts, h)
	}
	h, ok := Pick(hosts, l, c.rnd)
	if !ok {
		return store.Placement{}, store.ErrNoHost
	}
	s := store.Session{ID: l.SessionID, User: l.User, Group: l.Group, Host: h.Name, State: store.Launching, CreatedAt: l.Now, UpdatedAt: l.Now}
	if err := c.append(s); err != nil {
		return store.Placement{}, err
	}
	h.Sessions++
	h.Pending++
	if l.Personal {
		h.AssignedUser = l.User
	}
	c.hosts[h.Name] = h
	c.live[liveKey(l.User, l.Group)] = s
	return store.Placement{SessionID: s.ID, Host: h.Name, Address: h.Address, Port: h.Port, HostAlive: true}, nil
}

// append writes s to the journal and syncs it.
func (c *localCache) append(s store.Session) error {
	f, err := os.OpenFile(c.journal, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("broker: local host cache journal: %w", err)
	}
	if err := cutTornLine(f); err != nil {
		f.Close()
		return fmt.Errorf("broker: local host cache journal: %w", err)
	}
	b, _ := json.Marshal(s)
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("broker: local host cache journal: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("broker: local host cache journal: %w", err)
	}
	return f.Close()
}

// cutTornLine cuts a torn last line (a crash mid-append, before its
// launch was answered) off the journal: a line appended after it would
// join it, and the two be read as one line that is not JSON, losing an
// answered launch.
func cutTornLine(f *os.File) error {
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return err
	}
	var last [1]byte
	if _, err := f.ReadAt(last[:], st.Size()-1); err != nil {
		return err
	}
	if last[0] == '\n' {
		return nil
	}
	buf := make([]byte, 4096)
	for end := st.Size(); end > 0; {
		start := max(0, end-int64(len(buf)))
		n, err := f.ReadAt(buf[:end-start], start)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return f.Truncate(start + int64(i) + 1)
		}
		end = start
	}
	return f.Truncate(0)
}

// claim hands the journal over for writing back: it is renamed so that
// launches placed meanwhile start a new one. A journal claimed earlier
// and not yet written back (the database failed again, or the broker
// stopped) is handed over first.
func (c *localCache) claim() (string, error) {
	claimed := c.journal + ".restoring"
	if _, err := os.Stat(claimed); err == nil {
		return claimed, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := os.Rename(c.journal, claimed); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("broker: local host cache journal: %w", err)
	}
	return claimed, nil
}

// readJournal reads the sessions of a journal. A torn last line (a crash
// mid-write, before its launch was answered) is ignored.
func readJournal(path string) ([]store.Session, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("broker: local host cache journal: %w", err)
	}
	defer f.Close()
	var out []store.Session
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var s store.Session
		if json.Unmarshal(sc.Bytes(), &s) == nil && s.ID != "" {
			out = append(out, s)
		}
	}
	return out, sc.Err()
}

// event applies a session change to the copy.
func (c *localCache) event(e store.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.hosts[e.Host]
	if !ok {
		return
	}
	for _, u := range e.Users {
		k := liveKey(u, h.Group)
		s, ok := c.live[k]
		if !ok || s.Host != e.Host || s.State == e.State {
			continue
		}
		if s.State == store.Launching && h.Pending > 0 {
			h.Pending--
		}
		if e.State == store.Ended {
			if h.Sessions > 0 {
				h.Sessions--
			}
			delete(c.live, k)
			continue
		}
		s.State, s.UpdatedAt = e.State, e.Now
		c.live[k] = s
	}
	c.hosts[e.Host] = h
}

// register adds a host or updates its registration, keeping its counters.
func (c *localCache) register(h store.Host) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.hosts[h.Name]; ok {
		h.Sessions, h.Pending, h.AssignedUser = old.Sessions, old.Pending, old.AssignedUser
		h.CPU, h.Mem, h.DiskIdle, h.DiskLatency, h.MemPressure = old.CPU, old.Mem, old.DiskIdle, old.DiskLatency, old.MemPressure
		h.Unhealthy, h.AdminDrain, h.AgentDrain = old.Unhealthy, old.AdminDrain, old.AgentDrain
	} else {
		h.DiskIdle = 1
	}
	h.LastSeen = h.RegisteredAt
	c.hosts[h.Name] = h
}

// registered reports whether host is in the cache as registration.
func (c *localCache) registered(host, registration string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.hosts[host]
	return ok && h.Registration == registration
}

// remove forgets a host an administrator removed.
func (c *localCache) remove(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.hosts, name)
}

// heartbeat applies a host's report of load and health to the copy.
func (c *localCache) heartbeat(r store.Report) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.hosts[r.Host]
	if !ok {
		return false
	}
	h.CPU, h.Mem, h.DiskIdle, h.DiskLatency, h.MemPressure = r.CPU, r.Mem, r.DiskIdle, r.DiskLatency, r.MemPressure
	h.Unhealthy, h.AgentDrain, h.LastSeen = r.Unhealthy, r.Drain, r.Now
	c.hosts[r.Host] = h
	return true
}

// sessions returns the live sessions of user (every user's when empty),
// for the admin API while offline.
func (c *localCache) sessions(user string) []store.Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []store.Session
	for _, ss := range c.live {
		if user == "" || ss.User == user {
			out = append(out, ss)
		}
	}
	return out
}

// snapshot returns the hosts of group, for explanations while offline.
func (c *localCache) snapshot(group string) []store.Host {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []store.Host
	for _, h := range c.hosts {
		if group == "" || h.Group == group {
			out = append(out, h)
		}
	}
	return out
}
