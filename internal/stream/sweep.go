package stream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// sweptFile marks a shared cache the sweeper discarded: its boot's
// server died and nobody reconnected within the reconnect window. A
// client that comes back later is refused rather than handed a fresh,
// empty cache under the old name.
const sweptFile = "swept"

// sweepEvery is how often a server sweeps the shared store for window.
func sweepEvery(window time.Duration) time.Duration {
	return min(max(window/4, time.Second), time.Minute)
}

// sweep runs until ctx ends: on every tick it marks the shared caches
// this server owns as alive (so a server that dies leaves caches whose
// lock files tell when it last lived), then discards caches no server
// owns that nobody used within the reconnect window. Every server
// sharing the store sweeps; the flock on a cache's lock file keeps a
// sweeper off a boot another server has taken over.
func (s *Server) sweep(ctx context.Context) {
	window := s.cfg.ReconnectWindow.D()
	t := time.NewTicker(sweepEvery(window))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		s.mu.Lock()
		mine := map[string]bool{}
		for _, b := range s.boots {
			mine[b.dir] = true
			if b.cache != nil {
				_ = os.Chtimes(filepath.Join(b.dir, "lock"), now, now)
			}
		}
		s.mu.Unlock()
		dirs, _ := filepath.Glob(filepath.Join(s.cfg.Store, "cache", "*", "*", "*"))
		for _, dir := range dirs {
			if mine[dir] {
				continue
			}
			swept, err := sweepStoreCache(dir, window, now)
			if err != nil {
				s.log.Warn("sweeping a shared write cache", "dir", dir, "err", err)
			}
			if swept {
				s.log.Warn("discarded a boot's write cache: its server stopped and no client reconnected within the reconnect window",
					"dir", dir, "window", window)
			}
		}
	}
}

// sweepStoreCache discards the cache in dir if no server owns it and its
// lock file was last touched more than window ago, leaving a swept
// marker; markers older than lostRetention go too. It reports whether it
// discarded a cache.
func sweepStoreCache(dir string, window time.Duration, now time.Time) (bool, error) {
	if fi, err := os.Stat(filepath.Join(dir, sweptFile)); err == nil {
		if now.Sub(fi.ModTime()) > lostRetention {
			return false, os.RemoveAll(dir)
		}
		return false, nil
	}
	lock, err := lockIdle(dir, window, now)
	if lock == nil || err != nil {
		return false, err
	}
	defer lock.Close()
	// The marker first: from here on an attach refuses the boot.
	if err := os.WriteFile(filepath.Join(dir, sweptFile), []byte(now.UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		return false, fmt.Errorf("stream: sweep %s: %w", dir, err)
	}
	for _, f := range []string{"data", "map", bootVersionFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return true, fmt.Errorf("stream: sweep %s: %w", dir, err)
		}
	}
	return true, nil
}

// sweptError refuses a boot whose shared cache was discarded.
type sweptError struct{ at time.Time }

func (e *sweptError) Error() string {
	return "its write cache was discarded at " + e.at.UTC().Format(time.RFC3339)
}

// sweptAt reports when the cache in dir was swept, if it was.
func sweptAt(dir string) (time.Time, bool) {
	fi, err := os.Stat(filepath.Join(dir, sweptFile))
	if err != nil {
		return time.Time{}, false
	}
	return fi.ModTime(), true
}
