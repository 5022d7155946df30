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

	mu       sync.RWMutex
	ram      map[int64][]byte // block number → cacheBlock bytes
	zeros    blockSet         // blocks written as all zeroes, held as a bit
	ramLimit int64
	spillDir string
	spill    *os.File
	slots    map[int64]int64 // block number → offset in spill
	// written holds every block in ram, zeros or slots: reads ask it
	// first, block by block, and most blocks are the base's.
	written  blockSet
	nextSlot int64
	// slabs hold the RAM blocks outside the Go heap: the garbage
	// collector neither scans them nor sizes the heap by them, and they
	// go back to the system the moment the boot ends.
	slabs    [][]byte
	slabUsed int
	closed   bool
}

func newWriteCache(base io.ReaderAt, size, ramLimit int64, spillDir string) *writeCache {
	return &writeCache{base: base, size: size, ram: map[int64][]byte{}, zeros: blockSet{}, ramLimit: ramLimit, spillDir: spillDir, slots: map[int64]int64{}, written: blockSet{}}
}

// bytes reports how much the cache holds in RAM and in its spill file.
func (c *writeCache) bytes() (ram, spilled int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return int64(len(c.ram)) * cacheBlock, int64(len(c.slots)) * cacheBlock
}

// ReadAt reads the client's view: its own blocks where it wrote, the
// base elsewhere, in as few base reads as the layout allows.
func (c *writeCache) ReadAt(p []byte, off int64) (int, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return 0, os.ErrClosed
	}
	if len(c.written) == 0 {
		return readFull(c.base, p, off)
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		blk := pos / cacheBlock
		in := pos - blk*cacheBlock
		n := min(int64(len(p)-done), cacheBlock-in)
		if b, ok := c.ram[blk]; ok {
			copy(p[done:done+int(n)], b[in:])
		} else if c.zeros.has(blk) {
			clear(p[done : done+int(n)])
		} else if slot, ok := c.slots[blk]; ok {
			if _, err := c.spill.ReadAt(p[done:done+int(n)], slot+in); err != nil {
				return done, fmt.Errorf("write cache spill read: %w", err)
			}
		} else {
			// Extend over every following block the client never wrote.
			end := (blk + 1) * cacheBlock
			for end < off+int64(len(p)) && !c.has(end/cacheBlock) {
				end += cacheBlock
			}
			n = min(end, off+int64(len(p))) - pos
			if _, err := readFull(c.base, p[done:done+int(n)], pos); err != nil {
				return done, err
			}
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
	return n <= 0 || !c.written.any(off/cacheBlock, (off+n-1)/cacheBlock)
}

func (c *writeCache) has(blk int64) bool { return c.written.has(blk) }

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
		if src == nil && n == cacheBlock {
			// A whole block of zeroes (file systems zero journals and
			// inode tables this way) costs no memory.
			if c.written.has(blk) {
				delete(c.ram, blk)
				delete(c.slots, blk)
			}
			c.zeros.add(blk)
			c.written.add(blk)
			done += n
			continue
		}
		if c.zeros.has(blk) {
			c.zeros.remove(blk)
			b := make([]byte, cacheBlock)
			fill(b[in:in+n], src)
			if err := c.store(blk, b); err != nil {
				return int(done), err
			}
			c.written.add(blk)
			done += n
			continue
		}
		if b, ok := c.ram[blk]; ok {
			fill(b[in:in+n], src)
		} else if slot, ok := c.slots[blk]; ok {
			if src == nil {
				src = make([]byte, n)
			}
			if _, err := c.spill.WriteAt(src, slot+in); err != nil {
				return int(done), fmt.Errorf("write cache spill write: %w", err)
			}
		} else {
			b := make([]byte, cacheBlock)
			if n < cacheBlock {
				if _, err := readFull(c.base, b, blk*cacheBlock); err != nil {
					return int(done), err
				}
			}
			fill(b[in:in+n], src)
			if err := c.store(blk, b); err != nil {
				return int(done), err
			}
			c.written.add(blk)
		}
		done += n
	}
	return int(done), nil
}

// store keeps a new block in RAM while there is room, else in the spill file.
func (c *writeCache) store(blk int64, b []byte) error {
	if int64(len(c.ram)+1)*cacheBlock <= c.ramLimit {
		nb, err := c.newBlock()
		if err != nil {
			return err
		}
		copy(nb, b)
		c.ram[blk] = nb
		return nil
	}
	if c.spill == nil {
		if err := c.openSpill(); err != nil {
			return err
		}
	}
	// Slots are never reused: a block dropped for zeroes leaves a hole
	// behind, which the spill file's sparseness makes cheap enough.
	slot := c.nextSlot
	c.nextSlot += cacheBlock
	if _, err := c.spill.WriteAt(b, slot); err != nil {
		return fmt.Errorf("write cache spill write: %w", err)
	}
	c.slots[blk] = slot
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

// slabSize is how much RAM a cache maps at a time.
const slabSize = 1 << 20

// newBlock carves a block out of the cache's slabs.
func (c *writeCache) newBlock() ([]byte, error) {
	if len(c.slabs) == 0 || c.slabUsed == slabSize {
		slab, err := syscall.Mmap(-1, 0, slabSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err != nil {
			return nil, fmt.Errorf("write cache: %w", err)
		}
		c.slabs, c.slabUsed = append(c.slabs, slab), 0
	}
	b := c.slabs[len(c.slabs)-1][c.slabUsed : c.slabUsed+cacheBlock : c.slabUsed+cacheBlock]
	c.slabUsed += cacheBlock
	return b, nil
}

// Trim forgets the whole blocks inside [off, off+n): they read as the
// base again and their memory is freed.
func (c *writeCache) Trim(off, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for blk := (off + cacheBlock - 1) / cacheBlock; (blk+1)*cacheBlock <= off+n; blk++ {
		delete(c.ram, blk)
		c.zeros.remove(blk)
		delete(c.slots, blk)
		c.written.remove(blk)
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
	c.ram, c.slots, c.zeros, c.written = nil, nil, nil, nil
	for _, slab := range c.slabs {
		_ = syscall.Munmap(slab)
	}
	c.slabs = nil
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

// chunkBlocks is how many blocks one entry of a blockSet covers.
const chunkBlocks = 512

// blockSet is a sparse bitmap of block numbers: a 64-byte word group per
// 2 MiB of disk that holds any, so a boot's scattered writes cost little
// and a read's range is checked with one map lookup per 2 MiB.
type blockSet map[int64]*[chunkBlocks / 64]uint64

func (s blockSet) add(blk int64) {
	w := s[blk/chunkBlocks]
	if w == nil {
		w = new([chunkBlocks / 64]uint64)
		s[blk/chunkBlocks] = w
	}
	i := blk % chunkBlocks
	w[i/64] |= 1 << (i % 64)
}

func (s blockSet) remove(blk int64) {
	w := s[blk/chunkBlocks]
	if w == nil {
		return
	}
	i := blk % chunkBlocks
	w[i/64] &^= 1 << (i % 64)
	if *w == ([chunkBlocks / 64]uint64{}) {
		delete(s, blk/chunkBlocks)
	}
}

func (s blockSet) has(blk int64) bool {
	w := s[blk/chunkBlocks]
	i := blk % chunkBlocks
	return w != nil && w[i/64]&(1<<(i%64)) != 0
}

// any reports whether the set holds a block from first to last.
func (s blockSet) any(first, last int64) bool {
	for blk := first; blk <= last; {
		c := blk / chunkBlocks
		end := min(last, (c+1)*chunkBlocks-1)
		if w := s[c]; w != nil {
			for b := blk; b <= end; b++ {
				i := b % chunkBlocks
				if w[i/64]&(1<<(i%64)) != 0 {
					return true
				}
			}
		}
		blk = end + 1
	}
	return false
}
