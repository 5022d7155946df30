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
	"sync/atomic"
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
	reported map[string]string        // per host, what its last journaled report said of sessions and health
	// offline is the broker's word that the database is away. Only while
	// it is set may anything be journaled, and it is cleared (goOnline)
	// only with the journal written back, both under mu: nothing is
	// journaled after the write-back that the database has not seen.
	offline  *atomic.Bool
	journal  string
	savePath string // where save writes the copy
	// entitlements are those administrators set, saved with the copy.
	entitlements []store.Entitlement
	rnd          *rand.Rand
	// changes counts the changes this broker's own traffic made to the
	// copy; changedLive and changedHosts hold the count at each user
	// key's and host's last change, so that a reload read from the
	// database before a change does not undo it (loadSince).
	changes      uint64
	changedLive  map[string]uint64
	changedHosts map[string]uint64
}

// journalEntry is one line of the offline journal, which keeps, in the
// order they happened while the database was away, what must reach it
// when it returns: a launch placed from the copy (its session, as the
// line's own fields: older journals hold only these), or an agent's
// session event, a heartbeat that changed what the copy knew of a host's
// sessions, or an administrator's drain. Written back in order, they
// leave the database as if it had never been away.
type journalEntry struct {
	store.Session
	Event  *store.Event  `json:",omitempty"`
	Report *store.Report `json:",omitempty"`
	Drain  *drainEntry   `json:",omitempty"`
	// Void is the id of a placement sent to the database and given up
	// on, whose launch was then answered with no session of that id.
	Void string `json:",omitempty"`
}

// drainEntry is an administrator's drain of a host.
type drainEntry struct {
	Host  string
	Drain bool
}

func liveKey(user, group string) string { return user + "\x00" + group }

// errBackOnline says the database returned while a request was about to
// be journaled: it goes to the database instead.
var errBackOnline = errors.New("broker: the database is reachable again")

func newLocalCache(journal, snapshot string, offline *atomic.Bool) *localCache {
	return &localCache{hosts: map[string]store.Host{}, live: map[string]store.Session{}, reported: map[string]string{}, offline: offline, journal: journal, savePath: snapshot,
		rnd:         rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x5eed)),
		changedLive: map[string]uint64{}, changedHosts: map[string]uint64{}}
}

// cacheSnapshot is the local host cache as saved in the state directory.
type cacheSnapshot struct {
	Saved    time.Time       `json:"saved"`
	Hosts    []store.Host    `json:"hosts"`
	Sessions []store.Session `json:"sessions"`
	// Entitlements are those administrators set, as last read.
	Entitlements []store.Entitlement `json:"entitlements,omitempty"`
}

// save writes the copy to its file, complete or not at all: a temporary
// file, synced, renamed over the old one.
func (c *localCache) save(now time.Time) error {
	c.mu.Lock()
	snap := cacheSnapshot{Saved: now.UTC(), Hosts: make([]store.Host, 0, len(c.hosts)), Sessions: make([]store.Session, 0, len(c.live)),
		Entitlements: c.entitlements}
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

// replay applies to the copy what this broker's journals hold from
// before a restart, in order: launches placed while the database was
// down, and the agents' events and reports. A user's session the copy has
// already is not counted twice. It returns how many launches it applied.
func (c *localCache) replay() (int, error) {
	n := 0
	for _, path := range []string{c.journal + ".restoring", c.journal} {
		entries, err := readJournal(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return n, err
		}
		c.mu.Lock()
		for _, e := range entries {
			switch {
			case e.Event != nil:
				c.eventLocked(*e.Event)
			case e.Report != nil:
				c.reconcileLocked(*e.Report)
			case e.Drain != nil:
				c.drainLocked(e.Drain.Host, e.Drain.Drain)
			case e.Void != "":
			default:
				ss := e.Session
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
		}
		c.mu.Unlock()
	}
	return n, nil
}

// setEntitlements keeps es to save with the copy.
func (c *localCache) setEntitlements(es []store.Entitlement) {
	c.mu.Lock()
	c.entitlements = es
	c.mu.Unlock()
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
	c.loadSince(c.mark(), snap.Hosts, snap.Sessions, true)
	return snap, nil
}

// placed records a placement the database made.
func (c *localCache) placed(l store.Launch, p store.Placement) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.Reconnect {
		return
	}
	c.changedLocked(p.Host, liveKey(l.User, l.Group))
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
	if !c.offline.Load() {
		return store.Placement{}, errBackOnline
	}
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
	if err := c.append(journalEntry{Session: s}); err != nil {
		return store.Placement{}, err
	}
	h.Sessions++
	h.Pending++
	if l.Personal {
		h.AssignedUser = l.User
	}
	c.hosts[h.Name] = h
	c.live[liveKey(l.User, l.Group)] = s
	c.changedLocked(h.Name, liveKey(l.User, l.Group))
	return store.Placement{SessionID: s.ID, Host: h.Name, Address: h.Address, Port: h.Port, HostAlive: true}, nil
}

// void journals that the placement of id, sent to the database and given
// up on, was answered otherwise: should the statement reach the database
// late, the write-back deletes what it stored.
func (c *localCache) void(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.offline.Load() {
		return errBackOnline
	}
	return c.append(journalEntry{Void: id})
}

// append writes e to the journal and syncs it.
func (c *localCache) append(e journalEntry) error {
	f, err := os.OpenFile(c.journal, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("broker: local host cache journal: %w", err)
	}
	if err := cutTornLine(f); err != nil {
		f.Close()
		return fmt.Errorf("broker: local host cache journal: %w", err)
	}
	b, _ := json.Marshal(e)
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

// end forgets the live session with id, which the database ended.
func (c *localCache) end(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, s := range c.live {
		if s.ID != id {
			continue
		}
		c.changedLocked(s.Host, k)
		if h, ok := c.hosts[s.Host]; ok {
			if s.State == store.Launching && h.Pending > 0 {
				h.Pending--
			}
			if h.Sessions > 0 {
				h.Sessions--
			}
			c.hosts[s.Host] = h
		}
		delete(c.live, k)
		return
	}
}

// drain sets a host's admin drain, as the database did.
func (c *localCache) drain(host string, drain bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drainLocked(host, drain)
}

// offlineDrain drains a host (or ends its drain) while the database is
// away, journaled to be written back in its turn.
func (c *localCache) offlineDrain(host string, drain bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.offline.Load() {
		return errBackOnline
	}
	if _, ok := c.hosts[host]; !ok {
		return store.ErrNotFound
	}
	if err := c.append(journalEntry{Drain: &drainEntry{Host: host, Drain: drain}}); err != nil {
		return err
	}
	c.drainLocked(host, drain)
	return nil
}

func (c *localCache) drainLocked(host string, drain bool) {
	c.changedLocked(host)
	if h, ok := c.hosts[host]; ok {
		h.AdminDrain = drain
		c.hosts[host] = h
	}
}

// goOnline clears the offline flag unless a journal is still to be
// written back; it reports whether the flag was set before.
func (c *localCache) goOnline() (cleared bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, path := range []string{c.journal, c.journal + ".restoring"} {
		if _, err := os.Stat(path); err == nil {
			return false, fmt.Errorf("broker: %s is still to be written back", path)
		}
	}
	// The next outage journals each host's first report afresh: what
	// the database saw meanwhile came from elsewhere.
	c.reported = map[string]string{}
	return c.offline.Swap(false), nil
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

// readJournal reads the entries of a journal. A torn last line (a crash
// mid-write, before what it records was answered) is ignored.
func readJournal(path string) ([]journalEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("broker: local host cache journal: %w", err)
	}
	defer f.Close()
	var out []journalEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20) // a heartbeat of a host with many sessions
	for sc.Scan() {
		var e journalEntry
		if json.Unmarshal(sc.Bytes(), &e) == nil && (e.ID != "" || e.Event != nil || e.Report != nil || e.Drain != nil || e.Void != "") {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// event applies a session change the database took to the copy.
func (c *localCache) event(e store.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eventLocked(e)
}

// offlineEvent applies a session change to the copy while the database
// is away, and journals it to be written back in its turn.
func (c *localCache) offlineEvent(e store.Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.admitLocked(e.Host, e.Registration); err != nil {
		return err
	}
	if err := c.append(journalEntry{Event: &e}); err != nil {
		return err
	}
	c.eventLocked(e)
	c.learnEventLocked(e)
	return nil
}

// admitLocked lets an agent's report be journaled: only while the
// database is away, and only from the registration the host has now, as
// the database would check it.
func (c *localCache) admitLocked(host, registration string) error {
	if !c.offline.Load() {
		return errBackOnline
	}
	h, ok := c.hosts[host]
	if !ok {
		return errUnknownHost
	}
	if h.Registration != registration {
		return store.ErrNotFound
	}
	return nil
}

// errUnknownHost says a report came, while the database is away, from a
// host the copy does not hold: one that registered through another
// broker since the copy's last reload of the hosts. Its credential is
// good; the host is not removed, so the agent must not be told to
// register again (the database cannot take it), only to try later.
var errUnknownHost = errors.New("broker: this broker's local host cache does not hold the host yet")

func (c *localCache) eventLocked(e store.Event) {
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
		c.changedLocked(e.Host, k)
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
	c.changedLocked(h.Name)
	if old, ok := c.hosts[h.Name]; ok {
		h.Sessions, h.Pending, h.AssignedUser = old.Sessions, old.Pending, old.AssignedUser
		h.CPU, h.Mem, h.DiskIdle, h.DiskLatency, h.MemPressure = old.CPU, old.Mem, old.DiskIdle, old.DiskLatency, old.MemPressure
		h.CPUPressure = old.CPUPressure
		h.Unhealthy, h.AdminDrain, h.AgentDrain = old.Unhealthy, old.AdminDrain, old.AgentDrain
	} else {
		h.DiskIdle = 1
	}
	h.LastSeen = h.RegisteredAt
	c.hosts[h.Name] = h
}

// remove forgets a host an administrator removed.
func (c *localCache) remove(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.changedLocked(name)
	delete(c.hosts, name)
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
