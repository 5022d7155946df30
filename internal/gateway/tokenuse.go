package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/auth"
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
	// Reconnect records that token id, which has expired, opens a
	// reconnect from source: allowed only to a token that opened a tunnel
	// while valid, whose last tunnel closed (not by an administrator)
	// within the reconnect window, with uses left, from the address of
	// its first use. Refusals leave the record as it was, so they never
	// extend the window.
	Reconnect(id string, source netip.Addr) (end func(UseEnd), err error)
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

// inUseError refuses a token whose tunnel is open: a client's reconnect
// may meet it for moments (its old tunnel not yet ended, its node not
// yet known dead), so it is no failed login.
type inUseError struct{ where string }

func (e inUseError) Error() string {
	return "token is in use by an open tunnel" + e.where + "; a token opens one tunnel at a time"
}

// errNoGrant is the refusal of an expired token that never opened a
// tunnel (or whose record is gone): it earned no reconnect.
var errNoGrant = errors.New("token has expired and opened no tunnel that a reconnect could resume; the user launches the desktop again")

// errGrantOver is the refusal of an expired token whose last tunnel
// closed longer than the reconnect window ago.
func errGrantOver(window time.Duration) error {
	return fmt.Errorf("token has expired and its last tunnel closed more than gateway.reconnect_window (%s) ago; the user launches the desktop again", window)
}

// memTokenUses is TokenUses in memory. Entries leave once their token
// has expired and its reconnect window is over, so the record holds no
// more than the tokens minted or reconnected within that time.
type memTokenUses struct {
	max    int           // 0: no limit (benchmarks only)
	window time.Duration // gateway.reconnect_window
	now    func() time.Time

	mu      sync.Mutex
	m       map[string]*tokenUse
	pruneAt int
}

type tokenUse struct {
	uses    int
	source  netip.Addr
	open    bool
	revoked bool
	// closed is when the token's last tunnel that opened ended; the
	// reconnect window counts from it.
	closed time.Time
	// keep is when the entry may go: past the token's expiry and its
	// reconnect window.
	keep time.Time
}

func newMemTokenUses(max int, window time.Duration, now func() time.Time) *memTokenUses {
	if now == nil {
		now = time.Now
	}
	return &memTokenUses{max: max, window: window, now: now, m: map[string]*tokenUse{}, pruneAt: 4096}
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
			if !u.open && now.After(u.keep) {
				delete(t.m, k)
			}
		}
		t.pruneAt = max(4096, 2*len(t.m))
	}
	u := t.m[id]
	switch {
	case u == nil:
		u = &tokenUse{source: source, keep: expires.Add(time.Minute)} // past the verifier's leeway
		t.m[id] = u
	default:
		if err := t.refusal(u, source); err != nil {
			return nil, err
		}
	}
	return t.begin(id, u), nil
}

// Reconnect implements TokenUses.
func (t *memTokenUses) Reconnect(id string, source netip.Addr) (func(UseEnd), error) {
	if t.max == 0 || t.window <= 0 {
		// Without a record of uses nothing says the token opened a
		// tunnel; without a window there is no reconnect past expiry.
		return nil, errNoGrant
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	u := t.m[id]
	if u == nil || u.closed.IsZero() && !u.open && !u.revoked {
		return nil, errNoGrant
	}
	if err := t.refusal(u, source); err != nil {
		return nil, err
	}
	if t.now().Sub(u.closed) > t.window {
		return nil, errGrantOver(t.window)
	}
	return t.begin(id, u), nil
}

// refusal says why u may open no tunnel from source now, or nil.
func (t *memTokenUses) refusal(u *tokenUse, source netip.Addr) error {
	switch {
	case u.revoked:
		return errRevoked
	case u.open:
		return inUseError{}
	case u.source != source:
		return fmt.Errorf("token was first used from %s; it is not accepted from %s", u.source, source)
	case u.uses >= t.max:
		return fmt.Errorf("token has opened the %d tunnels it may (gateway.token_max_uses)", t.max)
	}
	return nil
}

// begin counts a use of u and returns its end; t.mu is held.
func (t *memTokenUses) begin(id string, u *tokenUse) func(UseEnd) {
	u.uses++
	u.open = true
	return func(how UseEnd) {
		t.mu.Lock()
		defer t.mu.Unlock()
		u.open = false
		u.revoked = u.revoked || how == UseRevoked
		if how == UseEnded {
			u.closed = t.now()
			u.keep = maxTime(u.keep, u.closed.Add(t.window))
		}
		if how == UseUnopened {
			// Given back whole: a token whose only use failed is as new,
			// bound to no address yet.
			if u.uses--; u.uses == 0 && t.m[id] == u {
				delete(t.m, id)
			}
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// verifyToken checks a PAA token; a non-nil expired says it is genuine
// but past its expiry, for the reconnect grant to judge, and is Verify's
// reason (how far apart the clocks look) for a refusal to name.
func (tn *tunnel) verifyToken(tok string) (c *auth.Claims, expired, err error) {
	tokens := tn.srv.deps.Tokens
	c, err = tokens.Verify(tok)
	if errors.Is(err, auth.ErrTokenExpired) {
		if ec, eerr := tokens.VerifyExpired(tok); eerr == nil {
			return ec, err, nil
		}
	}
	return c, nil, err
}
