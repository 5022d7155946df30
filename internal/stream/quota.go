package stream

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// cacheQuota caps the bytes write caches hold: over every boot
// (stream.max_cache_mb) and over the boots of one client name
// (stream.max_cache_mb_per_client). A write that would take a boot past
// either is refused with ENOSPC before any of it is stored, so the
// client's file system reports a full disk and nothing it wrote before
// is lost; rewriting blocks a boot holds, and zeroing whole blocks, cost
// nothing and are always let through.
type cacheQuota struct {
	limit, perClient int64 // bytes; 0 means none

	used    atomic.Int64 // charged and reserved, every boot
	mu      sync.Mutex   // guards clients
	clients map[string]*clientUse
}

// clientUse is what the boots of one client name hold.
type clientUse struct {
	used  atomic.Int64
	boots int // accounts open, guarded by cacheQuota.mu
}

func newCacheQuota(limit, perClient int64) *cacheQuota {
	return &cacheQuota{limit: limit, perClient: perClient, clients: map[string]*clientUse{}}
}

// open starts the account of one boot of client.
func (q *cacheQuota) open(client string) *cacheAccount {
	q.mu.Lock()
	defer q.mu.Unlock()
	c := q.clients[client]
	if c == nil {
		c = &clientUse{}
		q.clients[client] = c
	}
	c.boots++
	return &cacheAccount{q: q, client: client, use: c}
}

// cacheAccount is one boot's share of the quota. A nil account (a
// maintenance version, a private image) is never refused.
type cacheAccount struct {
	q      *cacheQuota
	client string
	use    *clientUse
	// charged is what the boot's cache holds, as last settled; the
	// cache's lock guards it.
	charged int64
	closed  bool // guarded by cacheQuota.mu
	// warned is when a refusal was last logged (Unix nanoseconds): a
	// client at its cap retries, and the log says so once a minute.
	warned atomic.Int64
}

// errCacheFull is a write refused by the quota.
type errCacheFull struct{ msg string }

func (e *errCacheFull) Error() string { return e.msg }

// reserve holds n bytes for a write about to grow the cache, or says
// which cap it would pass. The write settles what it really took, then
// unreserve gives the reservation back.
func (a *cacheAccount) reserve(n int64) error {
	if a == nil || n <= 0 {
		return nil
	}
	q := a.q
	total, mine := q.used.Add(n), a.use.used.Add(n)
	switch {
	case q.perClient > 0 && mine > q.perClient:
		a.unreserve(n)
		return &errCacheFull{fmt.Sprintf("write cache full: the boots of client %s hold %d MiB and this write needs %d KiB more, past stream.max_cache_mb_per_client (%d MiB); the disk reads as full until a boot of the client ends",
			a.client, (mine-n)>>20, (n+1023)>>10, q.perClient>>20)}
	case q.limit > 0 && total > q.limit:
		a.unreserve(n)
		return &errCacheFull{fmt.Sprintf("write cache full: all boots on this server hold %d MiB and this write needs %d KiB more, past stream.max_cache_mb (%d MiB); the disk reads as full until boots end",
			(total-n)>>20, (n+1023)>>10, q.limit>>20)}
	}
	return nil
}

func (a *cacheAccount) unreserve(n int64) {
	if a == nil || n <= 0 {
		return
	}
	a.q.used.Add(-n)
	a.use.used.Add(-n)
}

// settle charges what the cache holds now; the cache's lock is held.
func (a *cacheAccount) settle(now int64) {
	if a == nil || now == a.charged {
		return
	}
	d := now - a.charged
	a.charged = now
	a.q.used.Add(d)
	a.use.used.Add(d)
}

// close ends the account when the boot ends: whatever its cache held
// is discarded or no longer this server's. Its cache is closed or
// released, so nothing settles any more.
func (a *cacheAccount) close() {
	if a == nil {
		return
	}
	q := a.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if a.closed {
		return
	}
	a.closed = true
	a.settle(0)
	if a.use.boots--; a.use.boots == 0 {
		delete(q.clients, a.client)
	}
}

// cacheFull counts a write refused by the quota and logs it, once a
// minute per boot.
func (s *Server) cacheFull(b *boot, err error) {
	s.metrics.cacheFull.Inc()
	now := time.Now().UnixNano()
	if last := b.acct.warned.Load(); now-last < int64(time.Minute) || !b.acct.warned.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("write refused", "vdisk", b.vd.name, "client", b.client, "boot", b.id, "reason", err)
}
