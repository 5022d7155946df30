package stream

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// errCacheBusy means another server (or process) holds a boot's cache.
var errCacheBusy = errors.New("the boot's write cache is open on another server")

// storeCache is a boot's write cache kept as files on the shared store,
// so that a second server can take the boot over when the first dies:
// "data" is a sparse file the size of the disk holding written blocks at
// their own offsets, and "map" a bitmap with one bit per block. A write is
// in both files (the page cache) before it is acknowledged, so it
// survives the server process; FLUSH and FUA make it durable on disk.
// An exclusive flock on "lock" makes one server at a time the owner.
type storeCache struct {
	base io.ReaderAt
	size int64
	dir  string

	mu        sync.RWMutex
	lock      *os.File
	data, mp  *os.File
	bitmap    []byte
	present   int64
	discarded bool
	acct      *cacheAccount // charged for the blocks present
}

// openStoreCache takes ownership of the cache in dir, creating it empty
// if it does not exist, and loads its bitmap. A cache the sweeper
// discarded is refused with a *sweptError. beforeLock, when not nil, runs
// as the lock is taken, before anything is learnt of the cache: a test
// sweeps there, the race the order of lock and look guards against.
func openStoreCache(dir string, base io.ReaderAt, size int64, acct *cacheAccount, beforeLock func(dir string)) (*storeCache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("write cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("write cache: %w", err)
	}
	if err := flockBefore(lock, dir, beforeLock); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errCacheBusy
		}
		return nil, fmt.Errorf("write cache lock: %w", err)
	}
	// Checked under the lock: a sweeper marks a cache while it holds the
	// lock, so a cache unmarked now stays so while this server owns it.
	if at, swept := sweptAt(dir); swept {
		lock.Close()
		return nil, &sweptError{at: at}
	}
	c := &storeCache{base: base, size: size, dir: dir, lock: lock, acct: acct}
	if c.data, err = os.OpenFile(filepath.Join(dir, "data"), os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		c.release()
		return nil, fmt.Errorf("write cache: %w", err)
	}
	if c.mp, err = os.OpenFile(filepath.Join(dir, "map"), os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		c.release()
		return nil, fmt.Errorf("write cache: %w", err)
	}
	if err := c.loadMap(); err != nil {
		c.release()
		return nil, err
	}
	c.mu.Lock()
	c.settle()
	c.mu.Unlock()
	return c, nil
}

// flockBefore takes lock exclusively without waiting, running before
// first when it is not nil.
func flockBefore(lock *os.File, dir string, before func(dir string)) error {
	if before != nil {
		before(dir)
	}
	return syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

// loadMap reads which blocks the cache holds from its map file.
func (c *storeCache) loadMap() error {
	c.bitmap = make([]byte, ((c.size+cacheBlock-1)/cacheBlock+7)/8)
	if _, err := c.mp.ReadAt(c.bitmap, 0); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("write cache map: %w", err)
	}
	for _, b := range c.bitmap {
		for ; b != 0; b &= b - 1 {
			c.present++
		}
	}
	return nil
}

// viewStoreCache opens the cache in dir read-only and without its lock:
// a look at it as it stands that never holds up its writer (a
// maintenance version's delta being edited, or being promoted).
func viewStoreCache(dir string, base io.ReaderAt, size int64) (*storeCache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("write cache: %w", err)
	}
	c := &storeCache{base: base, size: size, dir: dir}
	var err error
	open := func(name string) (*os.File, error) {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDONLY|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("write cache: %w", err)
		}
		return f, nil
	}
	if c.data, err = open("data"); err != nil {
		return nil, err
	}
	if c.mp, err = open("map"); err != nil {
		c.release()
		return nil, err
	}
	if err := c.loadMap(); err != nil {
		c.release()
		return nil, err
	}
	return c, nil
}

func (c *storeCache) baseOnly(off, n int64) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.data == nil {
		return false
	}
	if c.present == 0 {
		return true
	}
	for blk := off / cacheBlock; blk*cacheBlock < off+n; blk++ {
		if c.has(blk) {
			return false
		}
	}
	return true
}

// source knows no zero blocks: zeroes are written as data here. A
// released cache claims data, never a hole it cannot vouch for.
func (c *storeCache) source(blk int64) blockSource {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.data != nil && !c.has(blk) {
		return fromBelow
	}
	return fromCacheData
}

// unheld counts the blocks a write of n bytes at off would add: those
// not present, but for whole blocks zeroed, which become holes. (A write
// into a block zeroed earlier takes disk it does not count: the cap may
// be passed by that one write.)
func (c *storeCache) unheld(off, n int64, zeroes bool) int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var k int64
	for blk := off / cacheBlock; blk*cacheBlock < off+n; blk++ {
		whole := blk*cacheBlock >= off && (blk+1)*cacheBlock <= off+n
		if (c.data == nil || !c.has(blk)) && !(zeroes && whole) {
			k++
		}
	}
	return k
}

func (c *storeCache) has(blk int64) bool { return c.bitmap[blk/8]&(1<<(blk%8)) != 0 }

func (c *storeCache) bytes() (ram, spilled int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return 0, c.present * cacheBlock
}

// ReadAt reads written blocks from the data file and the rest from the
// base, a run of like blocks at a time.
func (c *storeCache) ReadAt(p []byte, off int64) (int, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.data == nil {
		return 0, os.ErrClosed
	}
	end := off + int64(len(p))
	for pos := off; pos < end; {
		blk := pos / cacheBlock
		in := c.has(blk)
		runEnd := (blk + 1) * cacheBlock
		for runEnd < end && c.has(runEnd/cacheBlock) == in {
			runEnd += cacheBlock
		}
		runEnd = min(runEnd, end)
		dst := p[pos-off : runEnd-off]
		var err error
		if in {
			_, err = readFull(c.data, dst, pos)
		} else {
			_, err = readFull(c.base, dst, pos)
		}
		if err != nil {
			return int(pos - off), err
		}
		pos = runEnd
	}
	return len(p), nil
}

// WriteAt stores p at off.
func (c *storeCache) WriteAt(p []byte, off int64) (int, error) {
	return c.write(p, off, int64(len(p)))
}

// WriteZeroes stores n zero bytes at off.
func (c *storeCache) WriteZeroes(off, n int64) error {
	_, err := c.write(nil, off, n)
	return err
}

func (c *storeCache) write(p []byte, off, total int64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.data == nil {
		return 0, os.ErrClosed
	}
	defer c.settle()
	end := off + total
	// Partial blocks never written before take the rest of the block
	// from the base first, so the data file holds whole blocks.
	for _, blk := range []int64{off / cacheBlock, (end - 1) / cacheBlock} {
		bs, be := blk*cacheBlock, (blk+1)*cacheBlock
		if c.has(blk) || (off <= bs && end >= be) {
			continue
		}
		b := make([]byte, cacheBlock)
		if _, err := readFull(c.base, b, bs); err != nil {
			return 0, err
		}
		if _, err := c.data.WriteAt(b, bs); err != nil {
			return 0, fmt.Errorf("write cache data: %w", err)
		}
	}
	if p == nil {
		if err := c.zero(off, end); err != nil {
			return 0, err
		}
	} else if _, err := c.data.WriteAt(p, off); err != nil {
		return 0, fmt.Errorf("write cache data: %w", err)
	}
	first, last := off/cacheBlock, (end-1)/cacheBlock
	for blk := first; blk <= last; blk++ {
		if !c.has(blk) {
			c.bitmap[blk/8] |= 1 << (blk % 8)
			c.present++
		}
	}
	// The map is written after the data: a block is marked only once its
	// bytes are in place.
	if _, err := c.mp.WriteAt(c.bitmap[first/8:last/8+1], first/8); err != nil {
		return 0, fmt.Errorf("write cache map: %w", err)
	}
	return int(total), nil
}

// zero writes zeroes over [off, end) of the data file: whole blocks
// become a hole, which costs no disk, and the rest zero bytes.
func (c *storeCache) zero(off, end int64) error {
	hs, he := (off+cacheBlock-1)/cacheBlock*cacheBlock, end/cacheBlock*cacheBlock
	if he > hs && unix.Fallocate(int(c.data.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, hs, he-hs) == nil {
		if err := c.zeroBytes(off, hs); err != nil {
			return err
		}
		return c.zeroBytes(he, end)
	}
	return c.zeroBytes(off, end)
}

func (c *storeCache) zeroBytes(off, end int64) error {
	if end <= off {
		return nil
	}
	p := make([]byte, min(end-off, 1<<20))
	for pos := off; pos < end; pos += int64(len(p)) {
		n := min(int64(len(p)), end-pos)
		if _, err := c.data.WriteAt(p[:n], pos); err != nil {
			return fmt.Errorf("write cache data: %w", err)
		}
	}
	return nil
}

// settle charges the account the disk the data file takes: zeroed
// blocks are holes in it and cost nothing. c.mu is held.
func (c *storeCache) settle() {
	if c.acct == nil {
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(c.data.Fd()), &st); err == nil {
		c.acct.settle(st.Blocks * 512)
	}
}

// Trim keeps what the cache has: dropping blocks would mean rewriting the
// map, for space the sparse data file mostly does not use.
func (c *storeCache) Trim(off, n int64) {}

// Sync makes every acknowledged write durable.
func (c *storeCache) Sync() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.data == nil {
		return os.ErrClosed
	}
	if err := c.data.Sync(); err != nil {
		return err
	}
	return c.mp.Sync()
}

// release gives up ownership and keeps the files, for a reconnect here
// or on another server.
func (c *storeCache) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	_ = os.Chtimes(filepath.Join(c.dir, "lock"), now, now)
	for _, f := range []*os.File{c.data, c.mp, c.lock} {
		if f != nil {
			f.Close()
		}
	}
	c.data, c.mp, c.lock = nil, nil, nil
}

// close discards the cache: its files are removed.
func (c *storeCache) close() {
	c.mu.Lock()
	if c.data != nil && !c.discarded {
		c.discarded = true
		_ = os.RemoveAll(c.dir)
		c.acct.settle(0)
	}
	c.mu.Unlock()
	c.release()
}

// lockIdle takes the lock of the cache in dir when no server holds it
// and nobody touched it within idle; nil when it did not (or there is no
// cache). The caller closes the file, which drops the lock.
func lockIdle(dir string, idle time.Duration, now time.Time) (*os.File, error) {
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, nil // a server has the boot
	}
	if fi, err := lock.Stat(); err != nil || now.Sub(fi.ModTime()) < idle {
		lock.Close()
		return nil, err
	}
	return lock, nil
}

// bootVersionFile, in a shared cache's directory, holds the version the
// boot started on, written before the boot serves a request.
const bootVersionFile = "version"

// readBootVersion reads the version a shared cache's boot started on.
func readBootVersion(dir string) (int, bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, bootVersionFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("stream: boot version: %w", err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, false, fmt.Errorf("stream: boot version in %s: %w", dir, err)
	}
	return v, true, nil
}

// recordBootVersion writes the version file unless it exists, durably.
func recordBootVersion(dir string, version int) error {
	path := filepath.Join(dir, bootVersionFile)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("stream: boot version: %w", err)
	}
	_, err = fmt.Fprintf(f, "%d\n", version)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("stream: boot version: %w", err)
	}
	return syncDir(dir)
}
