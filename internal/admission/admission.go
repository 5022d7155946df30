// Package admission caps the connections a server holds before they
// authenticate: in all, and per source (an IPv4 address, or an IPv6 /64,
// which one host can fill on its own), so that no one host can take every
// slot and lock everyone else out.
package admission

import (
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/auth"
)

// Limiter counts the unauthenticated connections of a server.
type Limiter struct {
	max, perSource int

	mu       sync.Mutex
	total    int
	bySource map[netip.Prefix]int
}

// New makes a limiter of max connections in all and perSource from one
// source.
func New(max, perSource int) *Limiter {
	return &Limiter{max: max, perSource: perSource, bySource: map[netip.Prefix]int{}}
}

// Admit takes a slot for a connection from a and returns its source, or
// says which cap is full (what, such as "the gateway", names the server in
// that reason).
func (l *Limiter) Admit(a netip.Addr, what string) (netip.Prefix, string) {
	k := auth.Source(a)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.total >= l.max:
		return k, what + " holds its maximum of unauthenticated connections"
	case l.bySource[k] >= l.perSource:
		return k, "the address holds its maximum of unauthenticated connections"
	}
	l.total++
	l.bySource[k]++
	return k, ""
}

// Release gives back a slot that Admit gave to source k.
func (l *Limiter) Release(k netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.bySource[k]--; l.bySource[k] <= 0 {
		delete(l.bySource, k)
	}
}

// Count is how many connections hold a slot now.
func (l *Limiter) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Refusals logs refused connections at most once a second, with how many
// were refused since the last line: a flood must not flood the log too.
type Refusals struct {
	last atomic.Int64 // unix nanos of the last line
	seen atomic.Int64 // refusals since then
}

// Log notes one refusal of a connection from remote, and logs it (with
// the count since the last line) unless a line went out within a second.
func (r *Refusals) Log(log *slog.Logger, msg string, remote netip.Addr, why string) {
	n := r.seen.Add(1)
	now := time.Now().UnixNano()
	last := r.last.Load()
	if now-last < int64(time.Second) || !r.last.CompareAndSwap(last, now) {
		return
	}
	r.seen.Add(-n)
	log.Warn(msg, "remote", remote, "reason", why, "refused_since_last_log", n)
}
