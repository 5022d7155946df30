package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Throttle limits password guessing, counted at the step that checks the
// password. Failures count per source address (a spray of many users from
// one place) and per user and address (guessing one user's password). A
// user's failures from addresses that never logged in as that user lock
// the user for such unfamiliar addresses only, as Active Directory's smart
// lockout does: an attacker elsewhere cannot lock the user out of the
// addresses they work from. A login refused by the throttle is not a
// failure, and a success clears that user's count at that address. Keys of
// different kinds live in different maps, so a user name that looks like
// an address is only ever a user name. Memory is bounded: a user key is
// at most maxKeyBytes (longer names count under a digest), expired
// windows are dropped once per window, and past maxKeys entries a map
// drops expired windows first, then the oldest half.
type Throttle struct {
	perPair, perAddr int
	window           time.Duration
	now              func() time.Time
	maxKeys          int

	mu sync.Mutex
	// swept is when expired windows were last dropped from every map.
	swept      time.Time
	addr       map[netip.Prefix]*failures
	pair       map[pairKey]*failures
	unfamiliar map[string]*failures // per user, from addresses not familiar to them
	familiar   map[string]*familiarSet
}

type pairKey struct {
	user string
	addr netip.Prefix
}

type failures struct {
	first time.Time
	count int
}

// familiarSet is the addresses a user logged in from, newest last.
type familiarSet struct {
	addrs []netip.Prefix
	last  time.Time
}

// maxFamiliar is how many addresses are remembered per user.
const maxFamiliar = 16

// NewThrottle allows perPair failures of one user from one address, and
// the same number from all unfamiliar addresses together, and perAddr
// failures from one address over all users, each within window.
func NewThrottle(perPair, perAddr int, window time.Duration, now func() time.Time) *Throttle {
	if now == nil {
		now = time.Now
	}
	return &Throttle{perPair: perPair, perAddr: perAddr, window: window, now: now, maxKeys: 100000,
		addr: map[netip.Prefix]*failures{}, pair: map[pairKey]*failures{}, unfamiliar: map[string]*failures{},
		familiar: map[string]*familiarSet{}}
}

// Source is the key a source address counts under: the address, or the
// /64 of an IPv6 one, since one machine commonly holds a whole /64.
func Source(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p
	}
	return netip.PrefixFrom(a, a.BitLen())
}

// userKey is the name user's failures count under: its bare name in
// lower case, or, past maxKeyBytes, a digest of that, so that a key's
// size does not follow what a client typed.
func userKey(user string) string {
	u := strings.ToLower(BareName(user))
	if len(u) <= maxKeyBytes {
		return u
	}
	sum := sha256.Sum256([]byte(u))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// maxKeyBytes bounds a user key kept as it is.
const maxKeyBytes = 64

// Lockout says why a login is refused, and when to try again.
type Lockout struct {
	Reason     string
	RetryAfter time.Duration
}

// Error implements error.
func (l *Lockout) Error() string { return l.Reason }

// Check reports whether user may try a password from addr now; a nil
// result means yes. An empty user checks the address alone (a token
// login, which names no user until it is verified).
func (t *Throttle) Check(user string, addr netip.Addr) *Lockout {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.checkLocked(user, addr)
}

// checkLocked is Check with t.mu held.
func (t *Throttle) checkLocked(user string, addr netip.Addr) *Lockout {
	now, src := t.now(), Source(addr)
	if f := t.live(t.addr[src], now); f != nil && f.count >= t.perAddr {
		return t.lockout(f, now, fmt.Sprintf("%d failed logins from %s", f.count, addr))
	}
	if user == "" {
		return nil
	}
	return t.checkUserLocked(userKey(user), src, addr, now)
}

// checkUserLocked is the user's part of checkLocked, for user key u.
func (t *Throttle) checkUserLocked(u string, src netip.Prefix, addr netip.Addr, now time.Time) *Lockout {
	if f := t.live(t.pair[pairKey{u, src}], now); f != nil && f.count >= t.perPair {
		return t.lockout(f, now, fmt.Sprintf("%d failed logins as %s from %s", f.count, u, addr))
	}
	if !t.isFamiliar(u, src) {
		if f := t.live(t.unfamiliar[u], now); f != nil && f.count >= t.perPair {
			return t.lockout(f, now, fmt.Sprintf("%s is locked for addresses it has not logged in from, after %d failed logins from such addresses", u, f.count))
		}
	}
	return nil
}

// Fail records a wrong password (or a bad token, with user "") from addr.
func (t *Throttle) Fail(user string, addr netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now, src := t.now(), Source(addr)
	count(t, t.addr, src, now)
	if user == "" {
		return
	}
	u := userKey(user)
	count(t, t.pair, pairKey{u, src}, now)
	if !t.isFamiliar(u, src) {
		count(t, t.unfamiliar, u, now)
	}
}

// Succeed records a good login of user from addr: the address becomes
// familiar to the user and their failures from it are forgotten.
func (t *Throttle) Succeed(user string, addr netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	u, src := userKey(user), Source(addr)
	delete(t.pair, pairKey{u, src})
	fs := t.familiar[u]
	if fs == nil {
		if len(t.familiar) >= t.maxKeys {
			t.pruneFamiliar()
		}
		fs = &familiarSet{}
		t.familiar[u] = fs
	}
	fs.last = t.now()
	for i, a := range fs.addrs {
		if a == src {
			fs.addrs = append(fs.addrs[:i], fs.addrs[i+1:]...)
			break
		}
	}
	fs.addrs = append(fs.addrs, src)
	if len(fs.addrs) > maxFamiliar {
		fs.addrs = fs.addrs[len(fs.addrs)-maxFamiliar:]
	}
}

func (t *Throttle) isFamiliar(u string, src netip.Prefix) bool {
	fs := t.familiar[u]
	if fs == nil {
		return false
	}
	for _, a := range fs.addrs {
		if a == src {
			return true
		}
	}
	return false
}

// live returns f if its window is still open.
func (t *Throttle) live(f *failures, now time.Time) *failures {
	if f == nil || now.Sub(f.first) > t.window {
		return nil
	}
	return f
}

func (t *Throttle) lockout(f *failures, now time.Time, why string) *Lockout {
	retry := f.first.Add(t.window).Sub(now)
	return &Lockout{Reason: why + "; try again in " + retry.Round(time.Second).String(), RetryAfter: retry}
}

// sweep drops every expired window once a window has passed since the
// last sweep: the maps hold what the last two windows counted, not
// everything since they were last full. t.mu is held.
func (t *Throttle) sweep(now time.Time) {
	if now.Sub(t.swept) < t.window && !now.Before(t.swept) {
		return
	}
	t.swept = now
	dropExpired(t.addr, now, t.window)
	dropExpired(t.pair, now, t.window)
	dropExpired(t.unfamiliar, now, t.window)
}

func dropExpired[K comparable](m map[K]*failures, now time.Time, window time.Duration) {
	for k, f := range m {
		if now.Sub(f.first) > window {
			delete(m, k)
		}
	}
}

// count adds a failure for k in m, bounding m, and returns k's window.
func count[K comparable](t *Throttle, m map[K]*failures, k K, now time.Time) *failures {
	t.sweep(now)
	f, ok := m[k]
	if !ok || now.Sub(f.first) > t.window {
		if len(m) >= t.maxKeys {
			prune(m, now, t.window, t.maxKeys)
		}
		f = &failures{first: now}
		m[k] = f
	}
	f.count++
	return f
}

// prune drops expired windows, then, if still full, the oldest half.
func prune[K comparable](m map[K]*failures, now time.Time, window time.Duration, maxKeys int) {
	var oldest time.Time
	for k, f := range m {
		if now.Sub(f.first) > window {
			delete(m, k)
		} else if oldest.IsZero() || f.first.Before(oldest) {
			oldest = f.first
		}
	}
	if len(m) < maxKeys {
		return
	}
	cut := oldest.Add(now.Sub(oldest) / 2)
	for k, f := range m {
		if !f.first.After(cut) {
			delete(m, k)
		}
	}
}

// pruneFamiliar forgets the half of the users who logged in longest ago.
func (t *Throttle) pruneFamiliar() {
	var oldest time.Time
	for _, fs := range t.familiar {
		if oldest.IsZero() || fs.last.Before(oldest) {
			oldest = fs.last
		}
	}
	cut := oldest.Add(t.now().Sub(oldest) / 2)
	for u, fs := range t.familiar {
		if !fs.last.After(cut) {
			delete(t.familiar, u)
		}
	}
}
