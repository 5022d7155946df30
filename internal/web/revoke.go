package web

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// revocations are the sign-ins signed out on this portal, kept until
// their cookies would have expired anyway, in memory and, with a state
// directory, in a file read again at start: a copied cookie refused after
// sign-out stays refused across a restart. A farm's other portals do not
// see them: there, a copied cookie lasts until web.session_idle passes
// without use or web.session_max ends it.
//
// A user holds at most maxUserSignouts sign-outs by id; past that, a
// sign-out voids every cookie of the user issued up to it instead, so
// that a loop of sign-ins and sign-outs cannot grow the set, and every
// request's check stays one lookup.
type revocations struct {
	mu    sync.Mutex
	ids   map[string]revokedID
	users map[string]*userSignouts // by userKey
	path  string                   // "" keeps them in memory only
	// lines counts the file's lines, live or not, so that it is
	// rewritten with the live ones when mostly expired.
	lines int
	swept time.Time
}

// revokedID is one signed-out cookie: whose, and when it expires.
type revokedID struct {
	user  string
	until time.Time
}

// userSignouts is what is revoked of one user: how many cookies by id,
// and the cookies issued before voidBefore (Unix seconds), until the
// last of them expires.
type userSignouts struct {
	ids        int
	voidBefore int64
	until      time.Time
}

// maxUserSignouts is how many sign-outs one user keeps by id: more than
// a person has browsers.
const maxUserSignouts = 32

// sweepEvery is how often expired sign-outs are dropped: not on every
// sign-out, under the lock every request's check takes.
const sweepEvery = time.Minute

func userKey(user string) string { return strings.ToLower(user) }

// signoutsFile is the revocations' file in the state directory: one
// "ID UNIX-EXPIRY USER" line per sign-out, and "U UNIX-ISSUED
// UNIX-EXPIRY USER" for a user whose cookies issued before then are void.
const signoutsFile = "web-signouts"

// maxSignoutLine bounds a line of the file: longer ones (a torn write,
// a disk's zero-filled tail) are skipped, not read whole.
const maxSignoutLine = 1024

// loadRevocations reads the revocations kept in dir ("" for none) that
// have not expired at now, and rewrites the file with those. Lines it
// cannot read are skipped; a file it cannot rewrite (a read-only or full
// disk) is logged and appended to as it is: neither stops the portal.
func loadRevocations(dir string, now time.Time, log *slog.Logger) (*revocations, error) {
	v := &revocations{ids: map[string]revokedID{}, users: map[string]*userSignouts{}, swept: now}
	if dir == "" {
		return v, nil
	}
	v.path = filepath.Join(dir, signoutsFile)
	f, err := os.Open(v.path)
	if errors.Is(err, fs.ErrNotExist) {
		return v, nil
	}
	if err != nil {
		return nil, fmt.Errorf("web: reading the sign-outs: %w", err)
	}
	defer f.Close()
	err = eachLine(f, maxSignoutLine, func(line string) {
		v.lines++
		// A line cut short by a crash is skipped; the rest still hold.
		if rest, ok := strings.CutPrefix(line, "U "); ok {
			f := strings.SplitN(rest, " ", 3)
			if len(f) != 3 {
				return
			}
			issued, err1 := strconv.ParseInt(f[0], 10, 64)
			exp, err2 := strconv.ParseInt(f[1], 10, 64)
			if err1 == nil && err2 == nil && now.Before(time.Unix(exp, 0)) {
				v.void(f[2], issued, time.Unix(exp, 0))
			}
			return
		}
		f := strings.SplitN(line, " ", 3)
		if len(f) < 2 || f[0] == "" {
			return
		}
		sec, err := strconv.ParseInt(f[1], 10, 64)
		user := ""
		if len(f) == 3 {
			user = f[2]
		}
		if t := time.Unix(sec, 0); err == nil && now.Before(t) {
			v.revoke(f[0], user, t)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("web: reading %s: %w", v.path, err)
	}
	if err := v.rewrite(); err != nil {
		log.Warn("the sign-outs file could not be rewritten at start; it is appended to as it is", "error", err)
	}
	return v, nil
}

// add revokes si's cookie until it expires; the error says it could not
// be kept on disk (it holds in memory all the same).
func (v *revocations) add(si signIn, until, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.sweep(now)
	if v.hasLocked(si, now) {
		return nil
	}
	var line string
	if u := v.users[userKey(si.User)]; u != nil && u.ids >= maxUserSignouts {
		v.void(si.User, si.Issued+1, until)
		line = fmt.Sprintf("U %d %d %s", si.Issued+1, until.Unix(), si.User)
	} else {
		v.revoke(si.ID, si.User, until)
		line = fmt.Sprintf("%s %d %s", si.ID, until.Unix(), si.User)
	}
	if v.path == "" {
		return nil
	}
	if v.lines > 2*(len(v.ids)+len(v.users))+64 {
		if v.rewrite() == nil {
			return nil
		}
		// A file that cannot be replaced may still take a line.
	}
	if err := appendLine(v.path, line); err != nil {
		return fmt.Errorf("web: keeping a sign-out: %w", err)
	}
	v.lines++
	return nil
}

// revoke adds one cookie by id.
func (v *revocations) revoke(id, user string, until time.Time) {
	if _, ok := v.ids[id]; ok {
		return
	}
	v.ids[id] = revokedID{user: user, until: until}
	v.userOf(user).ids++
}

// void makes user's cookies issued before the Unix second issued void
// until until.
func (v *revocations) void(user string, issued int64, until time.Time) {
	u := v.userOf(user)
	u.voidBefore = max(u.voidBefore, issued)
	if until.After(u.until) {
		u.until = until
	}
}

func (v *revocations) userOf(user string) *userSignouts {
	u := v.users[userKey(user)]
	if u == nil {
		u = &userSignouts{}
		v.users[userKey(user)] = u
	}
	return u
}

// sweep drops expired sign-outs, at most once per sweepEvery.
func (v *revocations) sweep(now time.Time) {
	if now.Sub(v.swept) < sweepEvery && !now.Before(v.swept) {
		return
	}
	v.swept = now
	for id, r := range v.ids {
		if now.After(r.until) {
			delete(v.ids, id)
			v.users[userKey(r.user)].ids--
		}
	}
	for k, u := range v.users {
		if u.ids == 0 && now.After(u.until) {
			delete(v.users, k)
		}
	}
}

// rewrite replaces the file with the live revocations, atomically.
func (v *revocations) rewrite() error {
	var b strings.Builder
	for id, r := range v.ids {
		fmt.Fprintf(&b, "%s %d %s\n", id, r.until.Unix(), r.user)
	}
	for k, u := range v.users {
		if u.voidBefore != 0 {
			fmt.Fprintf(&b, "U %d %d %s\n", u.voidBefore, u.until.Unix(), k)
		}
	}
	tmp := v.path + ".tmp"
	// Synced before the rename and the directory after it: a power loss
	// leaves the old file or the new one, never an empty one.
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("web: keeping the sign-outs: %w", err)
	}
	_, err = f.WriteString(b.String())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, v.path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("web: keeping the sign-outs in %s: %w", v.path, err)
	}
	if d, err := os.Open(filepath.Dir(v.path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	v.lines = len(v.ids) + len(v.users)
	return nil
}

// has reports whether si's cookie is signed out.
func (v *revocations) has(si signIn, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.hasLocked(si, now)
}

func (v *revocations) hasLocked(si signIn, now time.Time) bool {
	if r, ok := v.ids[si.ID]; ok && !now.After(r.until) {
		return true
	}
	u := v.users[userKey(si.User)]
	return u != nil && si.Issued < u.voidBefore && !now.After(u.until)
}
