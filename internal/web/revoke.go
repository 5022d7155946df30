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

// maxSignoutLine bounds a line of the file: longer ones (a torn write,
// a disk's zero-filled tail) are skipped, not read whole.
const maxSignoutLine = 256

// loadRevocations reads the revocations kept in dir ("" for none) that
// have not expired at now, and rewrites the file with those. Lines it
// cannot read are skipped; a file it cannot rewrite (a read-only or full
// disk) is logged and appended to as it is: neither stops the portal.
func loadRevocations(dir string, now time.Time, log *slog.Logger) (*revocations, error) {
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
	defer f.Close()
	err = eachLine(f, maxSignoutLine, func(line string) {
		v.lines++
		id, exp, ok := strings.Cut(line, " ")
		sec, perr := strconv.ParseInt(exp, 10, 64)
		// A line cut short by a crash is skipped; the rest still hold.
		if ok && perr == nil && id != "" {
			if t := time.Unix(sec, 0); now.Before(t) {
				v.ids[id] = t
			}
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
		if v.rewrite() == nil {
			return nil
		}
		// A file that cannot be replaced may still take a line.
	}
	if err := appendLine(v.path, fmt.Sprintf("%s %d", id, until.Unix())); err != nil {
		return fmt.Errorf("web: keeping a sign-out: %w", err)
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
	v.lines = len(v.ids)
	return nil
}

func (v *revocations) has(id string, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.ids[id]
	return ok && !now.After(t)
}
