package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-ldap/ldap/v3"
)

// directoryRecheck is how long what the directory said of a signed-in
// user stands: a user removed from a group, disabled, deleted or whose
// password changed loses the sign-in's rights within this, not at the
// cookie's end, and a busy portal asks the directory once per user per
// period.
const directoryRecheck = 30 * time.Second

// directoryRetry is how long a directory that could not be asked about
// an entry is not asked again about it: while it is down, requests do not
// each wait for a dial.
const directoryRetry = 5 * time.Second

// directoryGrace is how long, while the directory cannot be asked, what
// it last said of a sign-in stands: a short outage signs nobody out, a
// long one does not let a deleted user launch for the cookie's lifetime.
const directoryGrace = 5 * time.Minute

// errAccountEnded says a directory sign-in no longer holds: the entry is
// gone or disabled, or its password changed after the sign-in.
var errAccountEnded = errors.New("web: the directory account is gone, disabled or has a new password")

// errDirectoryDown says the directory could not be asked about a
// sign-in for longer than directoryGrace.
var errDirectoryDown = errors.New("web: the directory has not answered about this sign-in for too long")

// directoryState is what the directory said of one entry, and when.
type directoryState struct {
	at     time.Time
	gone   bool   // no such entry, or disabled
	pwdSet string // see passwordSet
	groups []string
}

// cachedEntry is what the portal knows of one entry: the directory's
// last answer, and when it last could not be asked.
type cachedEntry struct {
	state    directoryState // zero at until the directory answered
	failedAt time.Time
}

// recheckCache keeps cachedEntries by DN.
type recheckCache struct {
	mu      sync.Mutex
	entries map[string]cachedEntry
}

// maxRecheckEntries bounds the cache; past it, expired entries go.
const maxRecheckEntries = 10000

func (c *recheckCache) get(key string) cachedEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[key]
}

// update changes key's entry with f, making room when the cache is full.
func (c *recheckCache) update(key string, now time.Time, f func(*cachedEntry)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]cachedEntry{}
	}
	if _, ok := c.entries[key]; !ok && len(c.entries) >= maxRecheckEntries {
		for k, e := range c.entries {
			if now.Sub(e.state.at) >= directoryGrace && now.Sub(e.failedAt) >= directoryRetry {
				delete(c.entries, k)
			}
		}
	}
	e := c.entries[key]
	f(&e)
	c.entries[key] = e
}

// signedIn notes what the directory said at a sign-in, so that the
// sign-in's first requests need not ask again.
func (l *ldapLogin) signedIn(e ldapEntry, now time.Time) {
	l.cache.update(strings.ToLower(e.dn), now, func(c *cachedEntry) {
		c.state = directoryState{at: now, pwdSet: e.pwdSet, groups: e.groups}
	})
}

// recheck returns the groups of the directory sign-in si now, from a
// state at most directoryRecheck old. Concurrent rechecks of one entry
// share one question to the directory, and wait for it: a request never
// goes on with what the directory said earlier because others keep it
// busy. errAccountEnded ends the sign-in; errDirectoryDown says the
// directory has not answered for longer than directoryGrace; any other
// error, that it cannot be asked now (the last answer, still in its
// grace, stands).
func (l *ldapLogin) recheck(ctx context.Context, si signIn, now time.Time) ([]string, error) {
	if si.DN == "" {
		// A cookie from before sign-ins named their entry.
		return nil, errAccountEnded
	}
	key := strings.ToLower(si.DN)
	c := l.cache.get(key)
	st := c.state
	var err error
	if st.at.IsZero() || now.Sub(st.at) >= directoryRecheck || now.Before(st.at) {
		if now.Sub(c.failedAt) < directoryRetry && !now.Before(c.failedAt) {
			err = fmt.Errorf("the directory did not answer %s ago", now.Sub(c.failedAt).Round(time.Second))
		} else {
			st, err = l.readShared(ctx, si.DN, key, now)
		}
		if err != nil {
			if c.state.at.IsZero() || now.Sub(c.state.at) >= directoryGrace || now.Before(c.state.at) {
				return nil, fmt.Errorf("%w: %w", errDirectoryDown, err)
			}
			st = c.state
		}
	}
	if st.gone || st.pwdSet != si.PwdSet {
		return nil, errAccountEnded
	}
	return st.groups, err
}

// readShared reads key's entry once for all who ask at once, under its
// own deadline: one asker going away does not fail the others.
func (l *ldapLogin) readShared(ctx context.Context, dn, key string, now time.Time) (directoryState, error) {
	ch := l.reads.DoChan(key, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		st, err := l.readEntry(rctx, dn)
		l.cache.update(key, now, func(c *cachedEntry) {
			if err != nil {
				c.failedAt = now
				return
			}
			st.at = now
			c.state, c.failedAt = st, time.Time{}
		})
		return st, err
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return directoryState{}, r.Err
		}
		st := r.Val.(directoryState)
		st.at = now
		return st, nil
	case <-ctx.Done():
		return directoryState{}, fmt.Errorf("the directory: reading %s took too long: %w", dn, ctx.Err())
	}
}

// readEntry asks the directory, as the reader, whether dn is still an
// enabled account, when its password was set, and its groups.
func (l *ldapLogin) readEntry(ctx context.Context, dn string) (directoryState, error) {
	// Rechecks have slots of their own, which they wait for: sign-ins
	// filling theirs must not leave a recheck unasked.
	select {
	case l.checks <- struct{}{}:
		defer func() { <-l.checks }()
	case <-ctx.Done():
		return directoryState{}, fmt.Errorf("the directory: waiting to read %s: %w", dn, ctx.Err())
	}
	conn, err := l.dial(ctx)
	if err != nil {
		return directoryState{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := l.reader(conn); err != nil {
		return directoryState{}, err
	}
	// Active Directory marks a disabled account in userAccountControl,
	// OpenLDAP's password policy a locked one with pwdAccountLockedTime.
	res, err := conn.Search(ldap.NewSearchRequest(dn, ldap.ScopeBaseObject, ldap.NeverDerefAliases, 1, 10, false,
		"(objectClass=*)", append([]string{"userAccountControl", "pwdAccountLockedTime"}, passwordAttributes...), nil))
	if ldap.IsErrorWithCode(err, ldap.LDAPResultNoSuchObject) || err == nil && len(res.Entries) != 1 {
		return directoryState{gone: true}, nil
	}
	if err != nil {
		return directoryState{}, fmt.Errorf("the directory: reading %s: %w", dn, err)
	}
	e := res.Entries[0]
	if uac, err := strconv.ParseUint(e.GetAttributeValue("userAccountControl"), 10, 32); err == nil && uac&2 != 0 {
		return directoryState{gone: true}, nil
	}
	if e.GetAttributeValue("pwdAccountLockedTime") != "" {
		return directoryState{gone: true}, nil
	}
	st := directoryState{pwdSet: passwordSet(e)}
	if st.groups, err = l.groups(ctx, conn, dn); err != nil {
		return directoryState{}, err
	}
	return st, nil
}

// passwordAttributes say when an entry's password was last set:
// OpenLDAP's password policy keeps pwdChangedTime, Active Directory
// pwdLastSet.
var passwordAttributes = []string{"pwdChangedTime", "pwdLastSet"}

// passwordSet is what e says of when its password was last set, as the
// directory wrote it; "" when it does not say. It is compared, not
// read as a time, so that the two clocks need not agree.
func passwordSet(e *ldap.Entry) string {
	for _, a := range passwordAttributes {
		if v := e.GetAttributeValue(a); v != "" {
			return a + "=" + v
		}
	}
	return ""
}

// recheckDirectory brings a directory sign-in's groups up to what the
// directory says now, or ends it when its account did. A directory that
// does not answer leaves the groups it last gave, for directoryGrace, so
// that a short outage signs nobody out; past that the sign-in is refused
// until the directory answers again, its cookie kept.
func (s *Server) recheckDirectory(r *http.Request, si *signIn, now time.Time) (keep bool, err error) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	groups, err := s.ldap.recheck(ctx, *si, now)
	switch {
	case errors.Is(err, errAccountEnded):
		s.d.Logger.Info("a directory sign-in ended: its account is gone, disabled or has a new password", "user", si.User, "dn", si.DN)
		// A copy of the cookie stays refused whatever the directory says
		// later, or whether it answers.
		if rerr := s.revoked.add(*si, time.Unix(si.Issued, 0).Add(s.cfg.SessionMax.D()), now); rerr != nil {
			s.d.Logger.Warn("an ended directory sign-in holds until this portal restarts: it could not be kept on disk", "user", si.User, "error", rerr)
		}
		return false, err
	case errors.Is(err, errDirectoryDown):
		s.d.Logger.Warn("the directory has not answered about a sign-in for too long; it is refused until it does", "user", si.User, "error", err)
		return true, err
	case err != nil:
		s.d.Logger.Warn("the directory could not recheck a sign-in; the groups it last gave stand", "user", si.User, "error", err)
	}
	si.Groups = groups
	return false, nil
}
