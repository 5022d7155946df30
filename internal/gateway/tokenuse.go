package gateway

import (
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// TokenUses records the tunnels each PAA token opens, so that a token
// is not a bearer anyone who sees it may replay: it opens at most max
// tunnels in its lifetime (one, unless reconnects are allowed), the
// reconnects only from the address of its first use, and never two at
// once. The record is kept in memory, so each node of a farm counts the
// uses it saw: a token opens one tunnel per node until the nodes share a
// store.
type TokenUses interface {
	// Begin records that token id (valid until expires) opens a tunnel
	// from source, or says why it may not; end is called when the tunnel
	// ends, with how it ended.
	Begin(id string, expires time.Time, source netip.Addr) (end func(UseEnd), err error)
}

// UseEnd is how a token's tunnel ended.
type UseEnd int

const (
	// UseUnopened: the channel never opened (the host could not be
	// reached); the use is given back, so the client may retry.
	UseUnopened UseEnd = iota
	// UseEnded: the tunnel opened and ended; the token's later uses are
	// the client's reconnects.
	UseEnded
	// UseRevoked: an administrator ended the tunnel; the token opens no
	// more, so the client's auto-reconnect does not undo the disconnect.
	UseRevoked
)

// errRevoked is the refusal of a token whose tunnel an administrator
// ended.
var errRevoked = fmt.Errorf("an administrator disconnected this token's tunnel, so it opens no more; the user launches the desktop again")

// memTokenUses is TokenUses in memory. Entries leave once their token
// has expired, so the record holds no more than the tokens minted within
// their lifetime.
type memTokenUses struct {
	max int // 0: no limit (benchmarks only)
	now func() time.Time

	mu      sync.Mutex
	m       map[string]*tokenUse
	pruneAt int
}

type tokenUse struct {
	uses    int
	source  netip.Addr
	open    bool
	revoked bool
	expires time.Time
}

func newMemTokenUses(max int, now func() time.Time) *memTokenUses {
	if now == nil {
		now = time.Now
	}
	return &memTokenUses{max: max, now: now, m: map[string]*tokenUse{}, pruneAt: 4096}
}

// Begin implements TokenUses.
func (t *memTokenUses) Begin(id string, expires time.Time, source netip.Addr) (func(UseEnd), error) {
	if t.max == 0 {
		return func(UseEnd) {}, nil
	}
	if id == "" {
		return nil, fmt.Errorf("token has no id (jti), so its uses cannot be counted; mint a new one")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) >= t.pruneAt {
		now := t.now()
		for k, u := range t.m {
			if now.After(u.expires) {
				delete(t.m, k)
			}
		}
		t.pruneAt = max(4096, 2*len(t.m))
	}
	u := t.m[id]
	switch {
	case u == nil:
		u = &tokenUse{source: source, expires: expires.Add(time.Minute)} // past the verifier's leeway
		t.m[id] = u
	case u.revoked:
		return nil, errRevoked
	case u.open:
		return nil, fmt.Errorf("token is in use by an open tunnel; a token opens one tunnel at a time")
	case u.source != source:
		return nil, fmt.Errorf("token was first used from %s; it is not accepted from %s", u.source, source)
	case u.uses >= t.max:
		return nil, fmt.Errorf("token has opened the %d tunnels it may (gateway.token_max_uses)", t.max)
	}
	u.uses++
	u.open = true
	return func(how UseEnd) {
		t.mu.Lock()
		defer t.mu.Unlock()
		u.open = false
		u.revoked = u.revoked || how == UseRevoked
		if how == UseUnopened {
			// Given back whole: a token whose only use failed is as new,
			// bound to no address yet.
			if u.uses--; u.uses == 0 && t.m[id] == u {
				delete(t.m, id)
			}
		}
	}, nil
}
