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

// errAccountEnded says a directory sign-in no longer holds: the entry is
// gone or disabled, or its password changed after the sign-in.
var errAccountEnded = errors.New("web: the directory account is gone, disabled or has a new password")

// directoryState is what the directory said of one entry, and when.
type directoryState struct {
	at     time.Time
	gone   bool   // no such entry, or disabled
	pwdSet string // see passwordSet
	groups []string
}

// recheckCache keeps directoryStates by DN.
type recheckCache struct {
	mu      sync.Mutex
	entries map[string]directoryState
}

// maxRecheckEntries bounds the cache; past it, expired entries go.
const maxRecheckEntries = 10000

// recheck returns the groups of the directory sign-in si now, from a
// state at most directoryRecheck old. errAccountEnded ends the sign-in;
// any other error says the directory could not be asked.
func (l *ldapLogin) recheck(ctx context.Context, si signIn, now time.Time) ([]string, error) {
	if si.DN == "" {
		// A cookie from before sign-ins named their entry.
		return nil, errAccountEnded
	}
	l.cache.mu.Lock()
	st, ok := l.cache.entries[strings.ToLower(si.DN)]
	l.cache.mu.Unlock()
	if !ok || now.Sub(st.at) >= directoryRecheck || now.Before(st.at) {
		var err error
		if st, err = l.readEntry(ctx, si.DN); err != nil {
			return nil, err
		}
		st.at = now
		l.cache.mu.Lock()
		if l.cache.entries == nil {
			l.cache.entries = map[string]directoryState{}
		}
		if len(l.cache.entries) >= maxRecheckEntries {
			for k, e := range l.cache.entries {
				if now.Sub(e.at) >= directoryRecheck {
					delete(l.cache.entries, k)
				}
			}
		}
		l.cache.entries[strings.ToLower(si.DN)] = st
		l.cache.mu.Unlock()
	}
	if st.gone || st.pwdSet != si.PwdSet {
		return nil, errAccountEnded
	}
	return st.groups, nil
}

// readEntry asks the directory, as the reader, whether dn is still an
// enabled account, when its password was set, and its groups.
func (l *ldapLogin) readEntry(ctx context.Context, dn string) (directoryState, error) {
	select {
	case l.slots <- struct{}{}:
		defer func() { <-l.slots }()
	default:
		return directoryState{}, errDirectoryBusy
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
// does not answer leaves the groups the sign-in had, so that an outage
// signs nobody out.
func (s *Server) recheckDirectory(r *http.Request, si *signIn, now time.Time) error {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	groups, err := s.ldap.recheck(ctx, *si, now)
	switch {
	case errors.Is(err, errAccountEnded):
		s.d.Logger.Info("a directory sign-in ended: its account is gone, disabled or has a new password", "user", si.User, "dn", si.DN)
		return err
	case err != nil:
		s.d.Logger.Warn("the directory could not recheck a sign-in; its groups stand", "user", si.User, "error", err)
		return nil
	}
	si.Groups = groups
	return nil
}
