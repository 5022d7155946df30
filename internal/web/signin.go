package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"

	"github.com/deskway/deskway/internal/auth"
)

// signin checks a name and password: a local account's here, any other
// name's in the directory. Each attempt counts against the throttle
// before its password is checked, so that concurrent guesses cannot all
// pass a limit none of them has reached yet; it is uncounted when it
// succeeds or the directory could not be asked before the password
// reached it.
func (s *Server) signin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		s.render(w, http.StatusBadRequest, "signin.html", s.signinData(page{Error: "The form could not be read; try again."}))
		return
	}
	name, pw := r.PostFormValue("user"), r.PostFormValue("password")
	from := remoteAddr(r)
	// A name longer than any account's is refused unread, counted against
	// the address alone: normalising it can multiply its size, and the
	// throttle would keep it.
	long := len(name) > maxNameBytes
	key := ""
	if !long {
		// Names a directory matches to one entry count as one: the
		// throttle keys on the folded form, not on what was typed.
		key = foldName(name)
	}
	att, lk := s.d.Throttle.Reserve(key, from)
	if long {
		name = ""
	}
	if lk != nil {
		s.throttled(w, name, lk)
		return
	}
	// entryAtt counts the attempt against the directory entry the name
	// found too, whichever of its names was typed.
	var entryAtt *auth.Attempt
	refuse := func() {
		att.Fail()
		if entryAtt != nil {
			entryAtt.Fail()
		}
		s.signins.WithLabelValues("wrong").Inc()
		s.d.Logger.Info("portal sign-in refused", "user", name, "remote", r.RemoteAddr)
		s.render(w, http.StatusUnauthorized, "signin.html", s.signinData(page{Name: name, Error: "Wrong user name or password."}))
	}
	var si signIn
	if long {
		refuse()
		return
	}
	if u, found := s.d.Users.Lookup(name); found {
		if !u.CheckPassword(pw) {
			refuse()
			return
		}
		si = signIn{User: u.Name, Groups: u.Groups}
	} else if s.ldap != nil {
		if !canonicalName(name) {
			// A directory ignores surrounding spaces and matches
			// look-alike letters ("ｃａｒｏｌ" for carol): each would be a
			// second name for one entry, with a lockout of its own.
			refuse()
			return
		}
		var entryLock *auth.Lockout
		onEntry := func(dn string) error {
			entryAtt, entryLock = s.d.Throttle.ReserveUser(entryKey(dn), from)
			if entryLock != nil {
				return entryLock
			}
			return nil
		}
		// The check outlives its client: a guess whose client hangs up
		// once the password is sent must still count, not be released by
		// a bind that the hang-up cut short.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 15*time.Second)
		e, err := s.ldap.authenticate(ctx, name, pw, onEntry)
		cancel()
		if entryLock != nil {
			// Not tried: the entry is locked under another of its names.
			att.Release()
			s.throttled(w, name, entryLock)
			return
		}
		if err == nil && s.isLocal(e.name) {
			s.d.Logger.Warn("a directory sign-in resolved to a local account's name; refused", "typed", name, "user", e.name)
			err = errWrongPassword
		}
		if err == nil && s.oidc != nil && inNamespace(e.name, s.oidc.cfg.Namespace) {
			s.d.Logger.Warn("a directory sign-in resolved to a name in the identity provider's namespace; refused", "typed", name, "user", e.name)
			err = errWrongPassword
		}
		if errors.Is(err, errWrongPassword) {
			refuse()
			return
		}
		if err != nil {
			if errors.Is(err, errPasswordSent) {
				att.Fail()
				entryAtt.Fail()
			} else {
				att.Release()
				if entryAtt != nil {
					entryAtt.Release()
				}
			}
			s.signins.WithLabelValues("ldap_unreachable").Inc()
			s.d.Logger.Warn("the directory could not check a sign-in", "user", name, "error", err)
			s.render(w, http.StatusServiceUnavailable, "signin.html", s.signinData(page{Name: name,
				Error: "The directory does not answer, so your password cannot be checked; try again later."}))
			return
		}
		entryAtt.Succeed(entryKey(e.dn))
		s.ldap.signedIn(e, s.d.Now())
		si = signIn{User: e.name, Groups: e.groups, Via: "ldap", DN: e.dn, PwdSet: e.pwdSet}
	} else {
		refuse()
		return
	}
	att.Succeed(si.User)
	now := s.d.Now().Unix()
	si.ID, si.Issued, si.Seen = newID(), now, now
	s.setCookie(w, si)
	result := si.Via
	if result == "" {
		result = "ok"
	}
	s.signins.WithLabelValues(result).Inc()
	s.d.Logger.Info("portal sign-in", "user", si.User, "via", result, "groups", si.Groups, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// throttled answers a sign-in the throttle turned away.
func (s *Server) throttled(w http.ResponseWriter, name string, lk *auth.Lockout) {
	s.signins.WithLabelValues("throttled").Inc()
	w.Header().Set("Retry-After", strconv.Itoa(int(lk.RetryAfter.Seconds())+1))
	s.render(w, http.StatusTooManyRequests, "signin.html", s.signinData(page{Name: name,
		Error: fmt.Sprintf("Too many failed sign-ins: try again in %s.", lk.RetryAfter.Round(time.Second))}))
}

// maxNameBytes is the longest user name the portal reads: longer than
// any directory's or local account's name.
const maxNameBytes = 256

// foldName is the form of a typed name the throttle counts under:
// compatibility-normalised and case-folded, so that every spelling a
// directory would match to one entry counts as that entry's.
func foldName(name string) string {
	return norm.NFKC.String(cases.Fold().String(norm.NFKC.String(name)))
}

// canonicalName reports whether a typed name is one a directory can only
// read as itself: no surrounding spaces or control characters, and
// already in Unicode compatibility form (no fullwidth or mathematical
// look-alikes of plain letters).
func canonicalName(name string) bool {
	return name != "" && name == strings.TrimSpace(name) &&
		!strings.ContainsFunc(name, func(c rune) bool { return c < ' ' || c == 0x7f }) &&
		norm.NFKC.IsNormalString(name)
}

// inNamespace reports whether name is USER@NAMESPACE, the form the
// identity provider's users take: no one else may sign in as such a name.
func inNamespace(name, namespace string) bool {
	return len(name) > len(namespace)+1 && strings.EqualFold(name[len(name)-len(namespace)-1:], "@"+namespace)
}
