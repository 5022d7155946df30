package auth

import "net/netip"

// Attempt is a login counted against the throttle before its password is
// checked: a check that takes time (a directory bind) must not let many
// concurrent guesses through a limit that each of them saw unreached.
// Exactly one of Fail, Succeed or Release ends it.
type Attempt struct {
	t    *Throttle
	user string
	addr netip.Addr
	// counted are the failure windows the attempt was counted in; a
	// window that restarted meanwhile is another struct, left alone.
	counted []*failures
}

// Reserve checks that user may try a password from addr, as Check does,
// and if so counts the attempt as a failure at once, under the same lock:
// of N concurrent attempts at most the throttle's limit get through.
func (t *Throttle) Reserve(user string, addr netip.Addr) (*Attempt, *Lockout) {
	return t.reserve(user, addr, true)
}

// ReserveUser is Reserve for a second name of an attempt already
// reserved (the account a typed name resolved to): it checks and counts
// the user's limits only, since the address's counted the attempt once.
func (t *Throttle) ReserveUser(user string, addr netip.Addr) (*Attempt, *Lockout) {
	return t.reserve(user, addr, false)
}

func (t *Throttle) reserve(user string, addr netip.Addr, withAddr bool) (*Attempt, *Lockout) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now, src := t.now(), Source(addr)
	if withAddr {
		if lk := t.checkLocked(user, addr); lk != nil {
			return nil, lk
		}
	} else if lk := t.checkUserLocked(userKey(user), src, addr, now); lk != nil {
		return nil, lk
	}
	a := &Attempt{t: t, user: user, addr: addr}
	if withAddr {
		a.counted = append(a.counted, count(t, t.addr, src, now))
	}
	if user != "" {
		u := userKey(user)
		a.counted = append(a.counted, count(t, t.pair, pairKey{u, src}, now))
		if !t.isFamiliar(u, src) {
			a.counted = append(a.counted, count(t, t.unfamiliar, u, now))
		}
	}
	return a, nil
}

// Fail ends the attempt as a wrong password: it stays counted.
func (a *Attempt) Fail() {}

// Release ends the attempt without a verdict (the password could not be
// checked): it no longer counts.
func (a *Attempt) Release() {
	a.t.mu.Lock()
	defer a.t.mu.Unlock()
	a.uncount()
}

// Succeed ends the attempt as a good login of user (the name the login
// resolved to): it no longer counts, and Throttle.Succeed applies to user
// and to the name the attempt was reserved under.
func (a *Attempt) Succeed(user string) {
	a.t.mu.Lock()
	a.uncount()
	a.t.mu.Unlock()
	a.t.Succeed(user, a.addr)
	if a.user != "" && userKey(a.user) != userKey(user) {
		a.t.Succeed(a.user, a.addr)
	}
}

func (a *Attempt) uncount() {
	for _, f := range a.counted {
		if f.count > 0 {
			f.count--
		}
	}
	a.counted = nil
}
