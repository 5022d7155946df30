package stream

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// attach joins (or starts) the boot of client on vd. With shared caches
// it takes ownership of the boot's cache files, which fails while
// another server serves that boot.
func (s *Server) attach(vd *vdisk, img *image, stage, client, id string) (*boot, error) {
	// The stage is part of the boot: golden@v0/pc/b1 and golden/pc/b1 are
	// two boots over two images, never one cache over either. Spellings
	// of one stage name one boot: golden@production is golden, and
	// @v00 or @v+0 is @v0.
	disk := vd.name
	if stage = canonicalStage(stage); stage != "" {
		disk += "@" + stage
	}
	key := disk + "/" + client + "/" + id
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.boots[key]
	fresh := b == nil || b.ended
	if fresh {
		if err := s.bootRoomLocked(client); err != nil {
			return nil, err
		}
	}
	if fresh && s.bootLog != nil {
		if r, lost := s.bootLog.lostAt(key); lost {
			why := r.Why
			if why == "" {
				why = "the server stopped (stream.shared_cache is off, so write caches do not survive the server)"
			}
			return nil, fmt.Errorf("boot %s started at %s and its write cache was lost: %s; %s", key, r.Time.Format(time.RFC3339), why, lostHint(vd.name, client, id))
		}
	}
	if fresh {
		dirID := id
		if dirID == "" {
			dirID = "-"
		}
		b = &boot{key: key, vd: vd, img: img, client: client, id: id, started: time.Now(),
			dir: filepath.Join(s.cfg.Store, "cache", disk, client, dirID)}
		b.acct = s.quota.open(client)
		if !s.cfg.SharedCache {
			wc := newWriteCache(img, vd.size, int64(s.cfg.CacheRAMMB)<<20, filepath.Join(s.cfg.Store, "cache"), b.acct)
			if s.reserver != nil {
				wc.reserver = s.reserver
				s.reserver.add(wc)
			}
			b.cache = wc
		}
	}
	if b.cache == nil {
		sc, err := s.ownStoreCache(b)
		if err != nil {
			if fresh {
				b.acct.close()
			}
			return nil, err
		}
		b.cache = sc
		if _, spilled := sc.bytes(); spilled > 0 {
			s.log.Info("boot taken over from the shared store", "vdisk", vd.name, "client", client, "boot", id, "cache_bytes", spilled)
		}
	}
	if fresh {
		s.boots[key] = b
		s.metrics.boots.Inc()
		s.log.Info("boot started", "vdisk", vd.name, "version", img.version, "client", client, "boot", id)
	} else if b.discardTimer != nil {
		b.discardTimer.Stop()
		b.discardTimer = nil
		s.log.Info("client reconnected to its boot", "vdisk", vd.name, "client", client, "boot", id)
	}
	b.conns++
	return b, nil
}

// ownStoreCache takes ownership of b's shared cache. What the store says
// of the boot is read only once the lock is held, so that no sweeper can
// discard the cache (or its version) between the look and the lock: a
// swept boot is refused, and a boot another server started (and died
// serving) goes on with the version it started on, whatever is newest now.
func (s *Server) ownStoreCache(b *boot) (*storeCache, error) {
	sc, err := openStoreCache(b.dir, b.img, b.vd.size, b.acct, s.beforeCacheLock)
	var se *sweptError
	if errors.As(err, &se) {
		return nil, fmt.Errorf("boot %s lost its write cache: its server stopped and no client reconnected within %s, so %w; %s",
			b.key, s.cfg.ReconnectWindow.D(), se, lostHint(b.vd.name, b.client, b.id))
	}
	if err != nil {
		return nil, err
	}
	v, ok, err := readBootVersion(b.dir)
	if err == nil && ok && v != b.img.version {
		var img *image
		if img, err = b.vd.imageOf(v); err != nil {
			err = fmt.Errorf("boot %s started on version %d, which cannot be read: %w", b.key, v, err)
		} else {
			b.img, sc.base = img, img
		}
	}
	if err == nil {
		err = recordBootVersion(b.dir, b.img.version)
	}
	if err != nil {
		sc.release()
		return nil, err
	}
	return sc, nil
}

// canonicalStage is the one spelling of a stage that boot keys use.
func canonicalStage(stage string) string {
	if stage == StageProduction {
		return ""
	}
	if n, err := strconv.Atoi(strings.TrimPrefix(stage, "v")); err == nil && strings.HasPrefix(stage, "v") {
		return "v" + strconv.Itoa(n)
	}
	return stage
}

// record makes b's start durable before any of its connections is
// served; the first connection writes it, the others wait for it.
func (s *Server) record(b *boot) error {
	if s.bootLog == nil {
		return nil
	}
	b.recordOnce.Do(func() { b.recordErr = s.bootLog.start(b.key, b.img.version) })
	return b.recordErr
}

// detach is called when a connection of b ends; disc says it sent
// NBD_CMD_DISC and wrote that it wrote to the disk. A boot ends only when
// its last connection leaves cleanly after writing: a probe (nbdinfo, a
// reader) or a second connection leaving does not end the client's boot.
func (s *Server) detach(b *boot, disc, wrote bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b.conns--
	if disc && wrote && b.conns == 0 {
		b.ended = true
	}
	if b.conns > 0 {
		return
	}
	if b.ended {
		s.discardLocked(b, "client disconnected")
		return
	}
	if sc, ok := b.cache.(*storeCache); ok {
		// Let another server take the boot while it is idle here.
		sc.release()
		b.cache = nil
	}
	window := s.cfg.ReconnectWindow.D()
	b.discardTimer = time.AfterFunc(window, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if b.conns == 0 && s.boots[b.key] == b {
			s.expireLocked(b, window)
		}
	})
}

// expireLocked ends b when its client did not come back within window.
// The boot is remembered as lost (in the boot log, or by the swept marker
// dropLocked leaves in a shared cache), so a client that comes back later
// is refused with the reason rather than handed an empty disk.
func (s *Server) expireLocked(b *boot, window time.Duration) {
	if s.bootLog != nil {
		s.bootLog.expire(b.key, fmt.Sprintf("no client reconnected within %s (stream.reconnect_window), so it was discarded at %s",
			window, time.Now().UTC().Format(time.RFC3339)))
	}
	s.dropLocked(b, fmt.Sprintf("no reconnect within %s", window))
}

// discardLocked ends b: its cache is dropped and the boot log forgets it.
func (s *Server) discardLocked(b *boot, why string) {
	if s.bootLog != nil {
		s.bootLog.end(b.key)
	}
	s.dropLocked(b, why)
}

// dropLocked drops b's cache; the boot log still holds it as live.
func (s *Server) dropLocked(b *boot, why string) {
	defer b.acct.close() // after the cache: nothing settles past it
	if s.boots[b.key] == b {
		delete(s.boots, b.key)
		s.metrics.boots.Dec()
	}
	if b.discardTimer != nil {
		b.discardTimer.Stop()
	}
	if b.cache == nil {
		// A released shared cache whose client did not come back: discard
		// it, leaving the swept marker, unless another server took the
		// boot over or used it within the reconnect window.
		removed, err := sweepStoreCache(b.dir, s.cfg.ReconnectWindow.D(), time.Now())
		if err != nil {
			s.log.Warn("could not remove a write cache", "dir", b.dir, "err", err)
		}
		if removed {
			s.log.Info("boot ended, write cache discarded", "vdisk", b.vd.name, "client", b.client, "boot", b.id, "why", why)
		}
		return
	}
	if s.trace != nil {
		s.trace.flush()
	}
	ram, spilled := b.cache.bytes()
	b.cache.close()
	b.cache = nil
	s.log.Info("boot ended, write cache discarded", "vdisk", b.vd.name, "client", b.client, "boot", b.id,
		"why", why, "cache_ram_bytes", ram, "cache_spill_bytes", spilled)
}

// cacheRAM sums the RAM of every live write cache.
func (s *Server) cacheRAM() float64 {
	s.mu.Lock()
	caches := make([]bootCache, 0, len(s.boots))
	for _, b := range s.boots {
		if b.cache != nil {
			caches = append(caches, b.cache)
		}
	}
	s.mu.Unlock()
	var n int64
	for _, c := range caches {
		ram, _ := c.bytes()
		n += ram
	}
	return float64(n)
}

// bootRoomLocked refuses a new boot past stream.max_boots, or past
// stream.max_boots_per_client for client: every boot holds a write cache,
// and a client that makes up boot ids must not make the server hold
// without end.
func (s *Server) bootRoomLocked(client string) error {
	if n := len(s.boots); n >= s.cfg.MaxBoots {
		return fmt.Errorf("the server holds its maximum of %d boots (stream.max_boots); try again once boots end", n)
	}
	n := 0
	for _, b := range s.boots {
		if b.client == client && !b.ended {
			n++
		}
	}
	if n >= s.cfg.MaxBootsPerClient {
		return fmt.Errorf("client %s already has %d live boots (stream.max_boots_per_client); a boot ends with a clean shutdown, or reconnect_window after its connection dropped, so a machine (or VM) powered off without a clean shutdown and on again several times in a row runs into this: wait reconnect_window, or raise max_boots_per_client", client, n)
	}
	return nil
}
