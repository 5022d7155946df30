package stream

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
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
// RAM is what is resident: whole slabs, but of the last one only the
// pages touched or reserved.
func (c *writeCache) bytes() (ram, spilled int64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if n := len(c.slabs); n > 0 {
		ram = int64(n-1)*slabSize + resident(c.slabs[n-1])
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
	}
	c.ramBlocks++
	if c.reserver != nil && k == int64(len(c.slabs)-1)*slabBlocks && c.wantsSlab() {
		// The first block out of the last slab: have the next one
		// faulted in before the writes reach it.
		c.reserver.add(c)
	}
	at := uint32(k + firstRAMBlock)
	return c.ramBlock(at), at, nil
}

// wantsSlab reports whether the reserver should map the cache another
// slab: it has none, or has handed out blocks of its last one, and the
// RAM limit leaves room for one more. c.mu is held.
func (c *writeCache) wantsSlab() bool {
	n := int64(len(c.slabs))
	return !c.closed && (n+1)*slabSize <= c.ramLimit && (n == 0 || c.ramBlocks > (n-1)*slabBlocks)
}

// mapSlab maps a slab of anonymous memory, outside the Go heap.
func mapSlab() ([]byte, error) {
	return syscall.Mmap(-1, 0, slabSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
}

// reserve maps the cache's next slab and faults its pages in, off the
// request path (see reserver): the first when the boot starts, and the
// next one as soon as writes take a block of the last, so a boot's
// writes find a slab of faulted-in room ahead of them. A fresh page costs
// a fault and a page of zeroes on first write, about 0.4 s a GiB on the
// bench machine; when every client of a storm writes a megabyte at the
// same moment, those faults were most of what receiving the writes
// cost, and they fell on the loops serving everyone's reads (a storm of
// 500 whose writes ran past the first slab stalled every client for a
// quarter of a second in about one run of three). A reserved slab counts
// as the cache's RAM from then on, as it would after a write.
func (c *writeCache) reserve() {
	c.mu.RLock()
	n, want := len(c.slabs), c.wantsSlab()
	c.mu.RUnlock()
	if !want {
		return
	}
	slab, err := mapSlab()
	if err != nil {
		return // the first write maps it
	}
	// MADV_POPULATE_WRITE (Linux 5.14) faults every page in one call;
	// an older kernel leaves the faults to the first write.
	_ = unix.Madvise(slab, unix.MADV_POPULATE_WRITE)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.slabs) != n {
		_ = syscall.Munmap(slab) // the cache mapped one itself meanwhile
		return
	}
	c.slabs = append(c.slabs, slab)
}

// A reserver reserves the slabs of boots' write caches ahead of their
// writes, one cache at a time, on one thread of low priority. With a goroutine per
// boot, a storm of 1,000 boots had as many threads faulting in a gigabyte
// at once, and the loops' share of the processors fell to almost nothing
// for most of a second. One thread at reserveNice takes what the loops
// leave; a cache whose first write comes before its turn maps its slab
// itself, as it would without a reserver.
type reserver struct {
	queue chan *writeCache
	stop  chan struct{}
	done  chan struct{}
}

// reserveNice is the reserving thread's nice value: low enough to give way
// to the loops, high enough to reserve a storm's caches in a few seconds
// while they are busy.
const reserveNice = 10

// startReserver starts the reserving thread; close stops it.
func startReserver() *reserver {
	r := &reserver{queue: make(chan *writeCache, 4096), stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

func (r *reserver) run() {
	defer close(r.done)
	// The goroutine keeps its thread and ends locked to it, so the thread
	// exits with it and its priority never reaches other goroutines.
	runtime.LockOSThread()
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), reserveNice)
	for {
		select {
		case <-r.stop:
			return
		case c := <-r.queue:
			c.reserve()
		}
	}
}

// add queues c; when the queue is full c's writes map their slab.
func (r *reserver) add(c *writeCache) {
	select {
	case r.queue <- c:
	default:
	}
}

func (r *reserver) close() {
	close(r.stop)
	<-r.done
}

// resident is how many bytes of slab are in memory.
func resident(slab []byte) int64 {
	var vec [slabBlocks]byte
	if _, _, e := unix.RawSyscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&slab[0])), uintptr(len(slab)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return slabSize
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * cacheBlock
}

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

// minStage is the smallest write received straight into cache blocks;
// a smaller one is copied in from a buffer, which costs less than
// setting that up.
const minStage = 64 << 10

// stagedWrite is a write's payload received straight into RAM blocks of
// the cache that the index does not name yet: commit puts them in place
// once all of it has arrived, abort hands them back, so a write whose
// payload does not arrive in full is never applied. Until then only the
// connection that staged it touches its blocks; a cache is closed only
// after every connection of its boot has ended.
//
// A storm of clients each writing a megabyte at once otherwise held a
// megabyte of heap per client as a buffer, and copied every byte twice.
type stagedWrite struct {
	c          *writeCache
	off        int64
	head, tail []byte // the parts in blocks the write covers in part
	first      int64  // the first whole block
	blocks     []uint32
	parts      [][]byte // where the payload goes, in order
}

// stage sets up a write of n bytes at off to be received into the cache;
// nil when it is too small, the cache is closed or has no RAM for it.
func (c *writeCache) stage(off, n int64) *stagedWrite {
	first := (off + cacheBlock - 1) / cacheBlock
	end := (off + n) / cacheBlock // past the whole blocks
	if n < minStage || end <= first {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.ramRoom() < end-first {
		return nil
	}
	st := &stagedWrite{c: c, off: off, first: first}
	if h := first*cacheBlock - off; h > 0 {
		st.head = make([]byte, h)
		st.parts = append(st.parts, st.head)
	}
	// Freed blocks are taken in the order they were freed, which is the
	// order of the blocks they held: a rewritten range gets runs again.
	take := min(int(end-first), len(c.free))
	st.blocks = append(st.blocks, c.free[len(c.free)-take:]...)
	c.free = c.free[:len(c.free)-take]
	for range int(end-first) - take {
		_, at, err := c.newBlock()
		if err != nil {
			c.free = append(c.free, st.blocks...)
			return nil
		}
		st.blocks = append(st.blocks, at)
	}
	// Blocks next to each other in a slab are read as one part, so a
	// large payload goes from the socket to the cache in one copy.
	var slab []byte
	var from, to int64
	for _, at := range st.blocks {
		k := int64(at - firstRAMBlock)
		sl, o := c.slabs[k/slabBlocks], (k%slabBlocks)*cacheBlock
		if slab != nil && &sl[0] == &slab[0] && o == to {
			to += cacheBlock
			continue
		}
		if slab != nil {
			st.parts = append(st.parts, slab[from:to])
		}
		slab, from, to = sl, o, o+cacheBlock
	}
	st.parts = append(st.parts, slab[from:to])
	if t := off + n - end*cacheBlock; t > 0 {
		st.tail = make([]byte, t)
		st.parts = append(st.parts, st.tail)
	}
	return st
}

// receive reads the payload from r into its places.
func (st *stagedWrite) receive(r io.Reader) error {
	for _, p := range st.parts {
		if _, err := io.ReadFull(r, p); err != nil {
			return err
		}
	}
	return nil
}

// commit applies the received write.
func (st *stagedWrite) commit() error {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return os.ErrClosed
	}
	defer c.settle()
	for i, at := range st.blocks {
		c.place(st.first+int64(i), at)
	}
	if st.head != nil {
		if _, err := c.writeLocked(st.head, st.off, int64(len(st.head))); err != nil {
			return err
		}
	}
	if st.tail != nil {
		end := st.first + int64(len(st.blocks))
		if _, err := c.writeLocked(st.tail, end*cacheBlock, int64(len(st.tail))); err != nil {
			return err
		}
	}
	return nil
}

// abort gives the staged blocks back, for a payload that did not arrive.
func (st *stagedWrite) abort() {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.free = append(c.free, st.blocks...)
	}
}

// chunkBlocks is how many blocks one entry of a blockIndex covers.
const chunkBlocks = 512

// Values of a blockIndex entry: inBase and isZero, or a block of the
// spill file (spilled with its slot), or a RAM block (firstRAMBlock on).
const (
	inBase  uint32 = 0 // never written: the base's bytes
	isZero  uint32 = 1 // written as zeroes, held as this mark alone
	spilled uint32 = 1 << 31
)

// blockIndex says where every written block of a cache is: an array per
// 2 MiB of disk that holds any (2 KiB, and a boot writes in a dozen or
// so), so a block costs one map lookup and a megabyte written 256 array
// stores, where a map per kind of block took several lookups a block.
type blockIndex map[int64]*[chunkBlocks]uint32

func (x blockIndex) get(blk int64) uint32 {
	if a := x[blk/chunkBlocks]; a != nil {
		return a[blk%chunkBlocks]
	}
	return inBase
}

// set records at for blk; a chunk left all inBase is dropped.
func (x blockIndex) set(blk int64, at uint32) {
	a := x[blk/chunkBlocks]
	if a == nil {
		if at == inBase {
			return
		}
		a = new([chunkBlocks]uint32)
		x[blk/chunkBlocks] = a
	}
	a[blk%chunkBlocks] = at
	if at == inBase && *a == ([chunkBlocks]uint32{}) {
		delete(x, blk/chunkBlocks)
	}
}

// any reports whether a block from first to last was written.
func (x blockIndex) any(first, last int64) bool {
	for blk := first; blk <= last; {
		c := blk / chunkBlocks
		end := min(last, (c+1)*chunkBlocks-1)
		if a := x[c]; a != nil {
			for _, at := range a[blk%chunkBlocks : end%chunkBlocks+1] {
				if at != inBase {
					return true
				}
			}
		}
		blk = end + 1
	}
	return false
}
