package stream

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestWriteCacheModel runs random writes, zero writes and reads against
// the cache and a plain byte slice, across the RAM limit into the spill
// file, on a base whose size is not a block multiple.
func TestWriteCacheModel(t *testing.T) {
	const size = 300*1024 + 123
	rng := rand.New(rand.NewSource(3))
	base := make([]byte, size)
	rng.Read(base)
	orig := bytes.Clone(base)
	model := bytes.Clone(base)
	dir := t.TempDir()
	c := newWriteCache(bytes.NewReader(base), size, 16*cacheBlock, dir, nil)
	exercise(t, c, rng, model, size)
	ram, spilled := c.bytes()
	if c.ramBlocks != 16 || ram < 16*cacheBlock || spilled == 0 {
		t.Errorf("%d RAM blocks (%d bytes resident), %d bytes spilled: the spill file was not used", c.ramBlocks, ram, spilled)
	}
	// Trim gives whole blocks back to the base and keeps partial ones.
	c.Trim(100, 8*cacheBlock)
	got := make([]byte, 9*cacheBlock)
	c.ReadAt(got, 0)
	if !bytes.Equal(got[:cacheBlock], model[:cacheBlock]) || !bytes.Equal(got[cacheBlock:8*cacheBlock], base[cacheBlock:8*cacheBlock]) ||
		!bytes.Equal(got[8*cacheBlock:], model[8*cacheBlock:9*cacheBlock]) {
		t.Error("trim did not revert exactly the whole blocks inside its range")
	}
	if !bytes.Equal(base, orig) {
		t.Fatal("the base was written")
	}
	c.close()
	if _, err := c.ReadAt(make([]byte, 1), 0); err == nil {
		t.Error("read after close succeeded")
	}
	// The spill file was unlinked when it was made; nothing stays behind.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left in the spill directory: %v", ents)
	}
}

// TestStoreCacheModel runs the same model against the shared-store cache,
// releasing and reopening it (a takeover) half way, and checks that only
// one owner at a time gets it.
func TestStoreCacheModel(t *testing.T) {
	const size = 300*1024 + 123
	rng := rand.New(rand.NewSource(4))
	base := make([]byte, size)
	rng.Read(base)
	orig := bytes.Clone(base)
	model := bytes.Clone(base)
	dir := filepath.Join(t.TempDir(), "boot")
	c, err := openStoreCache(dir, bytes.NewReader(base), size, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	exercise(t, c, rng, model, size)
	if _, err := openStoreCache(dir, bytes.NewReader(base), size, nil, nil); !errors.Is(err, errCacheBusy) {
		t.Fatalf("second owner: %v, want errCacheBusy", err)
	}
	c.release()
	c2, err := openStoreCache(dir, bytes.NewReader(base), size, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := c2.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("after takeover the cache differs: %v", err)
	}
	exercise(t, c2, rng, model, size)
	if err := c2.Sync(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(base, orig) {
		t.Fatal("the base was written")
	}
	c2.close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("discarded cache still on the store: %v", err)
	}
}

type modelCache interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	WriteZeroes(off, n int64) error
}

func exercise(t *testing.T, c modelCache, rng *rand.Rand, model []byte, size int64) {
	t.Helper()
	for i := 0; i < 3000; i++ {
		off := rng.Int63n(size)
		n := rng.Int63n(min(size-off, 3*cacheBlock)) + 1
		switch rng.Intn(3) {
		case 0:
			p := make([]byte, n)
			rng.Read(p)
			if _, err := c.WriteAt(p, off); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], p)
		case 1:
			if err := c.WriteZeroes(off, n); err != nil {
				t.Fatal(err)
			}
			clear(model[off : off+n])
		default:
			got := make([]byte, n)
			if _, err := c.ReadAt(got, off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, model[off:off+n]) {
				t.Fatalf("op %d: read %d bytes at %d differs from the model", i, n, off)
			}
		}
	}
	got := make([]byte, size)
	if _, err := c.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("whole read: %v", err)
	}
}

// TestStagedWriteModel receives large writes straight into the cache
// (stage, receive, commit) among ordinary writes and zeroes, aborts some
// half received, and checks the whole view against a model after each:
// an aborted write leaves nothing, its blocks are handed out again,
// trims give RAM back, and while RAM is spent writes take the ordinary
// path.
func TestStagedWriteModel(t *testing.T) {
	const size = 2 << 20
	rng := rand.New(rand.NewSource(4))
	base := make([]byte, size)
	rng.Read(base)
	model := bytes.Clone(base)
	q := newCacheQuota(0, 0)
	c := newWriteCache(bytes.NewReader(base), size, 1<<20, t.TempDir(), q.open("model"))
	defer c.close()
	check := func(i int) {
		t.Helper()
		got := make([]byte, size)
		if _, err := c.ReadAt(got, 0); err != nil || !bytes.Equal(got, model) {
			t.Fatalf("op %d: the view differs from the model (%v)", i, err)
		}
		// The quota is charged what the index names and the spill file
		// keeps, counted here from the index itself.
		var ram int64
		for _, a := range c.idx {
			for _, at := range a {
				if at >= firstRAMBlock && at&spilled == 0 {
					ram++
				}
			}
		}
		if want := (ram + c.nextSlot) * cacheBlock; q.used.Load() != want {
			t.Fatalf("op %d: quota charged %d, the cache holds %d RAM blocks and %d spill slots (%d bytes)", i, q.used.Load(), ram, c.nextSlot, want)
		}
		if free := c.ramBlocks - int64(len(c.free)); ram != free {
			t.Fatalf("op %d: the index names %d RAM blocks, %d are handed out", i, ram, free)
		}
	}
	staged, fellBack := 0, 0
	for i := 0; i < 300; i++ {
		n := minStage + rng.Int63n(200<<10)
		off := rng.Int63n(size - n)
		p := make([]byte, n)
		rng.Read(p)
		switch rng.Intn(5) {
		case 0:
			c.WriteAt(p[:n/16], off)
			copy(model[off:], p[:n/16])
		case 1:
			c.WriteZeroes(off, n/8)
			clear(model[off : off+n/8])
		case 2:
			// Trimmed whole blocks read as the base and free their RAM.
			c.Trim(off, n)
			first, end := (off+cacheBlock-1)/cacheBlock*cacheBlock, (off+n)/cacheBlock*cacheBlock
			copy(model[first:end], base[first:end])
		default:
			st := c.stage(off, n)
			if st == nil {
				fellBack++
				c.WriteAt(p, off)
				copy(model[off:], p)
				break
			}
			staged++
			if rng.Intn(3) == 0 {
				// The payload stops half way: nothing of it shows.
				before := c.ramBlocks
				if err := st.receive(bytes.NewReader(p[:n/2])); err == nil {
					t.Fatal("a short payload was received whole")
				}
				st.abort()
				check(i)
				if again := c.stage(off, n); again == nil || c.ramBlocks != before {
					t.Fatalf("op %d: an aborted write's blocks were not handed out again", i)
				} else {
					again.abort()
				}
				continue
			}
			if err := st.receive(bytes.NewReader(p)); err != nil {
				t.Fatal(err)
			}
			if err := st.commit(); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], p)
		}
		check(i)
		if c.ramBlocks*cacheBlock > 1<<20 {
			t.Fatalf("op %d: %d RAM blocks over the 1 MiB limit", i, c.ramBlocks)
		}
	}
	if staged < 50 || fellBack == 0 {
		t.Fatalf("%d writes staged, %d fell back: the test did not cover both", staged, fellBack)
	}
	if c.nextSlot == 0 {
		t.Fatal("nothing spilled: the test did not cover the spill file")
	}
	c.close()
	c.acct.close()
	if q.used.Load() != 0 || len(q.clients) != 0 {
		t.Fatalf("after the boot ended the quota still holds %d bytes for %d clients", q.used.Load(), len(q.clients))
	}
}

// TestBlockIndex checks the block index against a plain map under
// random sets, clears and range queries, including ranges that cross
// 2 MiB chunks, and that clearing every block drops every chunk.
func TestBlockIndex(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	x, model := blockIndex{}, map[int64]uint32{}
	for i := 0; i < 20000; i++ {
		blk := rng.Int63n(4 * chunkBlocks)
		var at uint32
		switch rng.Intn(4) {
		case 0: // inBase
		case 1:
			at = isZero
		case 2:
			at = spilled | uint32(rng.Intn(1000))
		default:
			at = firstRAMBlock + uint32(rng.Intn(1000))
		}
		x.set(blk, at)
		if at == inBase {
			delete(model, blk)
		} else {
			model[blk] = at
		}
		if got := x.get(blk); got != model[blk] {
			t.Fatalf("op %d: get(%d) = %#x, want %#x", i, blk, got, model[blk])
		}
		first := rng.Int63n(4 * chunkBlocks)
		last := first + rng.Int63n(chunkBlocks+100)
		want := false
		for b := first; b <= last; b++ {
			want = want || model[b] != inBase
		}
		if got := x.any(first, last); got != want {
			t.Fatalf("op %d: any(%d, %d) = %v, want %v", i, first, last, got, want)
		}
	}
	for blk := range model {
		x.set(blk, inBase)
	}
	if len(x) != 0 {
		t.Fatalf("%d chunks left after clearing every block", len(x))
	}
}

// TestSlabs checks the RAM a cache reports: what is resident, at least
// the blocks it handed out and at most the slabs it mapped, nothing once
// closed; and that a slab reserved when the boot starts is resident at
// once and is the one the first writes go to.
func TestSlabs(t *testing.T) {
	base := bytes.NewReader(make([]byte, 64<<20))
	c := newWriteCache(base, 64<<20, 32<<20, t.TempDir(), nil)
	if ram, _ := c.bytes(); ram != 0 {
		t.Fatalf("empty cache holds %d bytes of RAM", ram)
	}
	c.reserve()
	if ram, _ := c.bytes(); ram != slabSize || len(c.slabs) != 1 {
		t.Fatalf("reserved cache holds %d bytes of RAM in %d slabs, want one resident slab", ram, len(c.slabs))
	}
	p := bytes.Repeat([]byte{7}, cacheBlock)
	for i, blocks := range []int64{1, slabBlocks, slabBlocks + 3} {
		for c.ramBlocks < blocks {
			if _, err := c.WriteAt(p, c.ramBlocks*cacheBlock); err != nil {
				t.Fatal(err)
			}
		}
		ram, _ := c.bytes()
		if want := (blocks + slabBlocks - 1) / slabBlocks; int64(len(c.slabs)) != want {
			t.Errorf("step %d: %d blocks in %d slabs, want %d", i, blocks, len(c.slabs), want)
		}
		if ram < blocks*cacheBlock || ram > int64(len(c.slabs))*slabSize {
			t.Errorf("step %d: %d blocks in %d slabs reported as %d bytes of RAM", i, blocks, len(c.slabs), ram)
		}
	}
	c.close()
	if ram, _ := c.bytes(); ram != 0 {
		t.Fatalf("closed cache holds %d bytes of RAM", ram)
	}
	c.reserve() // after close: maps nothing
	if len(c.slabs) != 0 {
		t.Fatal("reserve after close kept a slab")
	}
}

// TestReserver checks that queued caches get their first slab from the
// reserving thread, that the thread runs at reserveNice, that adding to a
// full queue does not block, and that close returns with work queued.
func TestReserver(t *testing.T) {
	niceBefore, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	base := bytes.NewReader(make([]byte, 16<<20))
	r := startReserver()
	caches := make([]*writeCache, 8)
	for i := range caches {
		caches[i] = newWriteCache(base, 16<<20, 8<<20, t.TempDir(), nil)
		r.add(caches[i])
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range caches {
		for {
			if ram, _ := c.bytes(); ram == slabSize {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("a queued cache was not reserved in 10 s")
			}
			time.Sleep(time.Millisecond)
		}
	}
	// The thread is niced, the process is not.
	if p, err := unix.Getpriority(unix.PRIO_PROCESS, 0); err != nil || p != niceBefore {
		t.Errorf("process nice %d (%v), was %d", 20-p, err, 20-niceBefore)
	}
	niced := false
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if p, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil && 20-p == reserveNice {
			niced = true
		}
	}
	if !niced {
		t.Error("no thread runs at reserveNice")
	}
	r.close()
	// Stopped: the queue fills and add never blocks.
	for range cap(r.queue) + 10 {
		r.add(caches[0])
	}
	for _, c := range caches {
		c.close()
	}
}

// TestReserverStaysAhead: once writes take a block of a cache's last
// slab, the reserver faults the next one in before they reach it, up to
// the cache's RAM limit.
func TestReserverStaysAhead(t *testing.T) {
	r := startReserver()
	defer r.close()
	c := newWriteCache(bytes.NewReader(make([]byte, 16<<20)), 16<<20, 3*slabSize, t.TempDir(), nil)
	defer c.close()
	c.reserver = r
	slabs := func() int {
		c.mu.RLock()
		defer c.mu.RUnlock()
		return len(c.slabs)
	}
	waitSlabs := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for slabs() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d slabs mapped, want %d", slabs(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	r.add(c)
	waitSlabs(1)
	time.Sleep(50 * time.Millisecond)
	if slabs() != 1 {
		t.Fatal("a slab was reserved ahead of a boot that wrote nothing")
	}
	if _, err := c.WriteAt([]byte{1}, 0); err != nil {
		t.Fatal(err)
	}
	waitSlabs(2)
	// Fill the first slab and three-quarters of the second, then one
	// block more: the third comes, and it is the last the 3-slab limit
	// allows.
	if _, err := c.WriteAt(make([]byte, slabSize+3*slabSize/4), cacheBlock); err != nil {
		t.Fatal(err)
	}
	waitSlabs(3)
	if _, err := c.WriteAt(make([]byte, slabSize), 2*slabSize); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := slabs(); n != 3 {
		t.Fatalf("%d slabs past the 3-slab RAM limit", n)
	}
	if ram, _ := c.bytes(); ram != 3*slabSize {
		t.Fatalf("reserved slabs hold %d bytes resident, want %d", ram, 3*slabSize)
	}
}

// TestReserverZeroesNoSlabTheBootLeavesUnused replays the shape of the
// recorded boot's writes (internal/bench/bootstorm/boot-trace.csv: 85
// blocks of small writes, a 1 MiB write, then 53 blocks more, 1.5 MiB in
// all) and checks that its caches are reserved ahead of the 1 MiB burst
// but no further than the writes need: two slabs, not a third faulted in
// for the burst's last blocks and never used.
func TestReserverZeroesNoSlabTheBootLeavesUnused(t *testing.T) {
	// A reserver with no thread: the test serves its queue, so what was
	// asked for is reserved before the next write.
	r := &reserver{queue: make(chan *writeCache, 16)}
	serve := func() {
		for len(r.queue) > 0 {
			(<-r.queue).reserve()
		}
	}
	c := newWriteCache(bytes.NewReader(make([]byte, 64<<20)), 64<<20, 64<<20, t.TempDir(), nil)
	defer c.close()
	c.reserver = r
	r.add(c) // the boot starts
	serve()
	block := bytes.Repeat([]byte{7}, cacheBlock)
	at := int64(0)
	small := func(n int) {
		for range n {
			if _, err := c.WriteAt(block, at); err != nil {
				t.Fatal(err)
			}
			at += 2 * cacheBlock // a block apart: every write is a block of its own
			serve()
		}
	}
	small(85)
	if len(c.slabs) != 2 {
		t.Fatalf("%d slabs before the 1 MiB burst, want 2: its room is not faulted in ahead of it", len(c.slabs))
	}
	if _, err := c.WriteAt(make([]byte, slabSize), at); err != nil {
		t.Fatal(err)
	}
	at += slabSize
	serve()
	small(53)
	if got := c.ramBlocks; got != 394 {
		t.Fatalf("%d blocks written, want the recorded boot's 394", got)
	}
	if ram, _ := c.bytes(); len(c.slabs) != 2 || ram > 2*slabSize {
		t.Fatalf("%d blocks held in %d slabs (%d bytes resident), want 2 slabs: the reserver zeroed RAM the boot never used", c.ramBlocks, len(c.slabs), ram)
	}
}

// TestStoreCacheRefusesASweptCache: the sweeper marks a cache while it
// holds the cache's lock, so a server that takes the lock afterwards must
// see the mark and refuse the boot, never recreate an empty cache under
// the old name (a look before the lock would race the sweep).
func TestStoreCacheRefusesASweptCache(t *testing.T) {
	const size = 64 << 10
	base := bytes.NewReader(make([]byte, size))
	dir := filepath.Join(t.TempDir(), "boot")
	c, err := openStoreCache(dir, base, size, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt([]byte("acknowledged"), 0); err != nil {
		t.Fatal(err)
	}
	c.release()
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "lock"), old, old); err != nil {
		t.Fatal(err)
	}
	if swept, err := sweepStoreCache(dir, time.Minute, time.Now()); !swept || err != nil {
		t.Fatalf("sweep: %v %v", swept, err)
	}
	_, err = openStoreCache(dir, base, size, nil, nil)
	var se *sweptError
	if !errors.As(err, &se) {
		t.Fatalf("a swept cache was opened: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("opening a swept cache made its data file again: %v", err)
	}
}

// TestCountedRAMMatchesTheKernel: the write cache counts its resident
// RAM rather than asking the kernel (mincore); the count must be what
// the kernel says, for slabs the reserver faulted in and slabs writes
// mapped and filled block by block.
func TestCountedRAMMatchesTheKernel(t *testing.T) {
	c := newWriteCache(bytes.NewReader(make([]byte, 16<<20)), 16<<20, 8<<20, t.TempDir(), nil)
	defer c.close()
	kernel := func() int64 {
		var n int64
		for _, slab := range c.slabs {
			vec := make([]byte, slabBlocks)
			if _, _, e := unix.RawSyscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&slab[0])), uintptr(len(slab)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
				t.Fatal(e)
			}
			for _, v := range vec {
				n += int64(v & 1)
			}
		}
		return n * cacheBlock
	}
	check := func(step string) {
		t.Helper()
		if ram, _ := c.bytes(); ram != kernel() {
			t.Fatalf("%s: the cache counts %d bytes of RAM, the kernel has %d resident", step, ram, kernel())
		}
	}
	check("empty")
	at := int64(0)
	for _, blocks := range []int64{1, 100, slabBlocks + 3, slabBlocks / 2} {
		if _, err := c.WriteAt(bytes.Repeat([]byte{9}, int(blocks*cacheBlock)), at); err != nil {
			t.Fatal(err)
		}
		at += blocks * cacheBlock
		check(fmt.Sprintf("%d blocks written", c.ramBlocks))
	}
	// The second slab three-quarters used: the reserver faults the third
	// in whole while the second is still filling.
	c.reserve()
	if len(c.slabs) != 3 {
		t.Fatalf("%d slabs after a reserve with the second slab %d blocks in, want 3", len(c.slabs), c.ramBlocks-slabBlocks)
	}
	check("a reserved slab after a slab part used")
	if _, err := c.WriteAt(bytes.Repeat([]byte{3}, int(slabBlocks*cacheBlock)), at+cacheBlock/2); err != nil {
		t.Fatal(err)
	}
	check("writes through the rest of the second slab into the reserved one")
}
