package stream

import (
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// cacheBlock is the unit of the write cache: a partial write first copies
// the rest of its block from the base.
const cacheBlock = 4096

// writeCache is one client boot's private writes over a shared read-only
// base. Blocks live in RAM up to ramLimit bytes, then in a sparse spill
// file that is removed when the cache is closed. The base is never written.
type writeCache struct {
	base io.ReaderAt
	size int64

	mu sync.RWMutex
	// idx says where every written block is; reads and writes ask it
	// block by block, and most blocks are the base's.
	idx       blockIndex
	ramLimit  int64
	ramBlocks int64 // RAM blocks handed out of the slabs
	spillDir  string
	spill     *os.File
	nextSlot  int64 // spill blocks handed out
	// slabs hold the RAM blocks outside the Go heap: the garbage
	// collector neither scans them nor sizes the heap by them, and they
	// go back to the system the moment the boot ends.
	slabs [][]byte
	// free holds RAM blocks the index no longer names (replaced, zeroed,
	// trimmed, or staged for a write that never arrived), handed out again
	// before new slab space.
	free   []uint32
	closed bool
	// held counts the blocks the index names as data, in RAM or spilled,
	// and deadSlots the spill blocks no longer named, whose space the
	// spill file keeps; acct is charged for both.
	held, deadSlots int64
	acct            *cacheAccount
	reserver        *reserver // faults slabs in ahead of writes; nil without
	asked           int       // how many slabs the cache had when it last queued for one
	// faulted says of each slab whether the reserver faulted it in
	// whole; the pages of one a write mapped come in as its blocks are
	// handed out.
	faulted []bool
}

func newWriteCache(base io.ReaderAt, size, ramLimit int64, spillDir string, acct *cacheAccount) *writeCache {
	return &writeCache{base: base, size: size, idx: blockIndex{}, ramLimit: ramLimit, spillDir: spillDir, acct: acct}
}

// place makes the index name at for blk, giving up what it named.
func (c *writeCache) place(blk int64, at uint32) {
	old := c.idx.get(blk)
	c.drop(old)
	if isData(old) {
		c.held--
		if old&spilled != 0 {
			c.deadSlots++
		}
	}
	if isData(at) {
		c.held++
	}
	c.idx.set(blk, at)
}

func isData(at uint32) bool { return at != inBase && at != isZero }

// settle charges the account what the cache holds; c.mu is held.
func (c *writeCache) settle() {
	c.acct.settle((c.held + c.deadSlots) * cacheBlock)
}

// unheld counts the blocks a write of n bytes at off would add to the
// cache: those it holds no data for, but for whole blocks zeroed, which
// cost nothing.
func (c *writeCache) unheld(off, n int64, zeroes bool) int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var k int64
	for blk := off / cacheBlock; blk*cacheBlock < off+n; blk++ {
		whole := blk*cacheBlock >= off && (blk+1)*cacheBlock <= off+n
		if !isData(c.idx.get(blk)) && !(zeroes && whole) {
			k++
		}
	}
	return k
}

// bytes reports how much the cache holds in RAM and in its spill file.
// RAM is what is resident: the slabs the reserver faulted in, and of
// the others the blocks handed out of them. Counted, not asked of the
// kernel: with mincore on each cache, every scrape of the metrics in a
// storm of 1,000 boots took 1 % of the server's CPU.
func (c *writeCache) bytes() (ram, spilled int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i, whole := range c.faulted {
		if whole {
			ram += slabSize
			continue
		}
		// Blocks are handed out of the slabs in order, each written as
		// it is, so a slab's pages come in up to its last block out.
		ram += min(slabBlocks, max(0, c.ramBlocks-int64(i)*slabBlocks)) * cacheBlock
	}
	return ram, c.nextSlot * cacheBlock
}

// ReadAt reads the client's view: its own blocks where it wrote, the
// base elsewhere, in as few base reads as the layout allows.
func (c *writeCache) ReadAt(p []byte, off int64) (int, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return 0, os.ErrClosed
	}
	if len(c.idx) == 0 {
		return readFull(c.base, p, off)
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		blk := pos / cacheBlock
		in := pos - blk*cacheBlock
		n := min(int64(len(p)-done), cacheBlock-in)
		switch at := c.idx.get(blk); {
		case at == inBase:
			// Extend over every following block the client never wrote.
			end := (blk + 1) * cacheBlock
			for end < off+int64(len(p)) && c.idx.get(end/cacheBlock) == inBase {
				end += cacheBlock
			}
			n = min(end, off+int64(len(p))) - pos
			if _, err := readFull(c.base, p[done:done+int(n)], pos); err != nil {
				return done, err
			}
		case at == isZero:
			clear(p[done : done+int(n)])
		case at&spilled != 0:
			if _, err := c.spill.ReadAt(p[done:done+int(n)], c.spillOffset(at)+in); err != nil {
				return done, fmt.Errorf("write cache spill read: %w", err)
			}
		default:
			copy(p[done:done+int(n)], c.ramBlock(at)[in:])
		}
		done += int(n)
	}
	return done, nil
}

func (c *writeCache) baseOnly(off, n int64) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return false
	}
	return n <= 0 || !c.idx.any(off/cacheBlock, (off+n-1)/cacheBlock)
}

func (c *writeCache) source(blk int64) blockSource {
	c.mu.RLock()
	defer c.mu.RUnlock()
	switch at := c.idx.get(blk); {
	case c.closed:
		return fromCacheData
	case at == inBase:
		return fromBelow
	case at == isZero:
		return fromCacheZero
	}
	return fromCacheData
}

// WriteAt stores p at off in the cache; nil p writes zeroes of length n.
func (c *writeCache) WriteAt(p []byte, off int64) (int, error) {
	return c.write(p, off, int64(len(p)))
}

// WriteZeroes stores n zero bytes at off.
func (c *writeCache) WriteZeroes(off, n int64) error {
	_, err := c.write(nil, off, n)
	return err
}

func (c *writeCache) write(p []byte, off, total int64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, os.ErrClosed
	}
	defer c.settle()
	return c.writeLocked(p, off, total)
}

func (c *writeCache) writeLocked(p []byte, off, total int64) (int, error) {
	var done int64
	for done < total {
		pos := off + done
		blk := pos / cacheBlock
		in := pos - blk*cacheBlock
		n := min(total-done, cacheBlock-in)
		var src []byte
		if p != nil {
			src = p[done : done+n]
		}
		at := c.idx.get(blk)
		switch {
		case src == nil && n == cacheBlock:
			// A whole block of zeroes (file systems zero journals and
			// inode tables this way) costs no memory. A block it
			// replaces goes back to the free list.
			c.place(blk, isZero)
		case at == inBase || at == isZero:
			if err := c.create(blk, in, src, n, at == isZero); err != nil {
				return int(done), err
			}
		case at&spilled != 0:
			if src == nil {
				src = make([]byte, n)
			}
			if _, err := c.spill.WriteAt(src, c.spillOffset(at)+in); err != nil {
				return int(done), fmt.Errorf("write cache spill write: %w", err)
			}
		default:
			fill(c.ramBlock(at)[in:in+n], src)
		}
		done += n
	}
	return int(done), nil
}

// create makes blk a block of the cache holding src (zeroes when nil) at
// in, and around it the base's bytes, or zeroes when zero. It lives in
// RAM while there is room, else in the spill file. A RAM block is built
// in its place in a slab: a block-sized buffer for each would be garbage
// the moment it was copied, and a storm of clients each writing a
// megabyte at once made the collector run through their writes.
func (c *writeCache) create(blk, in int64, src []byte, n int64, zero bool) error {
	ram := c.ramRoom() > 0
	var b []byte
	var at uint32
	if ram {
		var err error
		if b, at, err = c.newBlock(); err != nil {
			return err
		}
	} else {
		b = make([]byte, cacheBlock)
	}
	switch {
	case n == cacheBlock:
		// src covers it all.
	case zero:
		clear(b) // a block from the free list holds old bytes
	default:
		if _, err := readFull(c.base, b, blk*cacheBlock); err != nil {
			return err
		}
	}
	fill(b[in:in+n], src)
	if !ram {
		if c.spill == nil {
			if err := c.openSpill(); err != nil {
				return err
			}
		}
		// Slots are never reused: a block dropped for zeroes leaves a
		// hole behind, which the spill file's sparseness makes cheap.
		at = spilled | uint32(c.nextSlot)
		if _, err := c.spill.WriteAt(b, c.spillOffset(at)); err != nil {
			return fmt.Errorf("write cache spill write: %w", err)
		}
		c.nextSlot++
	}
	c.place(blk, at)
	return nil
}

func (c *writeCache) openSpill() error {
	if err := os.MkdirAll(c.spillDir, 0o700); err != nil {
		return fmt.Errorf("write cache: %w", err)
	}
	f, err := os.CreateTemp(c.spillDir, "cache-*.spill")
	if err != nil {
		return fmt.Errorf("write cache: %w", err)
	}
	// Unlinked at once: the file goes away with the process even after a crash.
	_ = os.Remove(f.Name())
	c.spill = f
	return nil
}

// A cache maps RAM a slab at a time; a RAM block's index value counts
// from firstRAMBlock, below which are inBase and isZero.
const (
	slabSize      = 1 << 20
	slabBlocks    = slabSize / cacheBlock
	firstRAMBlock = 2
)

// newBlock hands out a RAM block, from the free list or the slabs, with
// its index value; its bytes are undefined.
func (c *writeCache) newBlock() ([]byte, uint32, error) {
	if k := len(c.free); k > 0 {
		at := c.free[k-1]
		c.free = c.free[:k-1]
		return c.ramBlock(at), at, nil
	}
	k := c.ramBlocks
	if k/slabBlocks >= int64(len(c.slabs)) {
		slab, err := mapSlab()
		if err != nil {
			return nil, 0, fmt.Errorf("write cache: %w", err)
		}
		c.slabs = append(c.slabs, slab)
		c.faulted = append(c.faulted, false)
	}
	c.ramBlocks++
	if c.reserver != nil && c.asked != len(c.slabs) && c.wantsSlab() {
		// Have the next slab faulted in before the writes reach it; once
		// per slab, not per block.
		c.asked = len(c.slabs)
		c.reserver.add(c)
	}
	at := uint32(k + firstRAMBlock)
	return c.ramBlock(at), at, nil
}

// reserveNice is the reserving thread's nice value: low enough to give way
// to the loops, high enough to reserve a storm's caches in a few seconds
// while they are busy.
const reserveNice = 10

// ramRoom is how many more RAM blocks the cache may hand out.
func (c *writeCache) ramRoom() int64 {
	return int64(len(c.free)) + c.ramLimit/cacheBlock - c.ramBlocks
}

// drop puts the RAM block at names, if it names one, on the free list.
func (c *writeCache) drop(at uint32) {
	if at >= firstRAMBlock && at&spilled == 0 {
		c.free = append(c.free, at)
	}
}

// ramBlock is the RAM block an index value names.
func (c *writeCache) ramBlock(at uint32) []byte {
	k := int64(at - firstRAMBlock)
	o := (k % slabBlocks) * cacheBlock
	return c.slabs[k/slabBlocks][o : o+cacheBlock : o+cacheBlock]
}

// spillOffset is where in the spill file the block an index value names is.
func (c *writeCache) spillOffset(at uint32) int64 { return int64(at&^spilled) * cacheBlock }

// Trim forgets the whole blocks inside [off, off+n): they read as the
// base again. Their RAM goes back to the free list; spill space is not
// handed out again before the boot ends.
func (c *writeCache) Trim(off, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.settle()
	for blk := (off + cacheBlock - 1) / cacheBlock; (blk+1)*cacheBlock <= off+n; blk++ {
		c.place(blk, inBase)
	}
}

// Sync has nothing to do: a RAM cache lives only as long as its boot.
func (c *writeCache) Sync() error { return nil }

// close discards everything the client wrote.
func (c *writeCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	c.idx, c.free = nil, nil
	c.held, c.deadSlots = 0, 0
	c.settle()
	for _, slab := range c.slabs {
		_ = syscall.Munmap(slab)
	}
	c.slabs, c.faulted = nil, nil
	if c.spill != nil {
		_ = c.spill.Close()
	}
}

func fill(dst, src []byte) {
	if src == nil {
		clear(dst)
		return
	}
	copy(dst, src)
}

// readFull reads len(p) bytes at off; the part of p past the end of r
// reads as zeroes, so an image whose size is not a block multiple works.
func readFull(r io.ReaderAt, p []byte, off int64) (int, error) {
	n, err := r.ReadAt(p, off)
	if err == io.EOF {
		clear(p[n:])
		return len(p), nil
	}
	if err != nil {
		return n, fmt.Errorf("base read at %d: %w", off, err)
	}
	return n, nil
}

// minStage is the smallest write received straight into cache blocks;
// a smaller one is copied in from a buffer, which costs less than
// setting that up.
const minStage = 64 << 10

// chunkBlocks is how many blocks one entry of a blockIndex covers.
const chunkBlocks = 512

// Values of a blockIndex entry: inBase and isZero, or a block of the
// spill file (spilled with its slot), or a RAM block (firstRAMBlock on).
const (
	inBase  uint32 = 0 // never written: the base's bytes
	isZero  uint32 = 1 // written as zeroes, held as this mark alone
	spilled uint32 = 1 << 31
)
