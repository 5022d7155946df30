package web

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
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
type revocations struct {
	mu   sync.Mutex
	ids  map[string]time.Time // id → when its cookie expires
	path string               // "" keeps them in memory only
	// lines counts the file's lines, live or not, so that it is
	// rewritten with the live ones when mostly expired.
	lines int
}

// signoutsFile is the revocations' file in the state directory: one
// "ID UNIX-EXPIRY" line per sign-out.
const signoutsFile = "web-signouts"

// loadRevocations reads the revocations kept in dir ("" for none) that
// have not expired at now, and rewrites the file with those.
func loadRevocations(dir string, now time.Time) (*revocations, error) {
	v := &revocations{ids: map[string]time.Time{}}
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
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, exp, ok := strings.Cut(sc.Text(), " ")
		sec, err := strconv.ParseInt(exp, 10, 64)
		// A line cut short by a crash is skipped; the rest still hold.
		if !ok || err != nil || id == "" {
			continue
		}
		if t := time.Unix(sec, 0); now.Before(t) {
			v.ids[id] = t
		}
	}
	err = sc.Err()
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("web: reading %s: %w", v.path, err)
	}
	if err := v.rewrite(); err != nil {
		return nil, err
	}
	return v, nil
}

// add revokes id until its cookie expires; the error says it could not
// be kept on disk (it holds in memory all the same).
func (v *revocations) add(id string, until, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	for k, t := range v.ids {
		if now.After(t) {
			delete(v.ids, k)
		}
	}
	v.ids[id] = until
	if v.path == "" {
		return nil
	}
	if v.lines > 2*len(v.ids)+64 {
		return v.rewrite()
	}
	f, err := os.OpenFile(v.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("web: keeping a sign-out: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s %d\n", id, until.Unix())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("web: keeping a sign-out in %s: %w", v.path, err)
	}
	v.lines++
	return nil
}

// rewrite replaces the file with the live revocations, atomically.
func (v *revocations) rewrite() error {
	var b strings.Builder
	for id, t := range v.ids {
		fmt.Fprintf(&b, "%s %d\n", id, t.Unix())
	}
	tmp := v.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("web: keeping the sign-outs: %w", err)
	}
	if err := os.Rename(tmp, v.path); err != nil {
		return fmt.Errorf("web: keeping the sign-outs: %w", err)
	}
	v.lines = len(v.ids)
	return nil
}

func (v *revocations) has(id string, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.ids[id]
	return ok && !now.After(t)
}
