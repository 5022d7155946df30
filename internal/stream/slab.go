package stream

import (
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// wantsSlab reports whether the reserver should map the cache another
// slab, within the RAM limit: the first when the boot starts, the second
// with its first write, and each later one once the last is
// three-quarters used. c.mu is held.
//
// A boot that writes at all writes in bursts (the recorded boot writes
// 1 MiB at once, 12.5 s in, with a third of a slab used), so its second
// slab is faulted in before it is needed. Past that, a slab ahead of
// every slab begun was memory zeroed for nothing: the recorded boot's
// 1.5 MiB of writes begin a second slab inside the burst, which asked for
// a third, and every boot of a storm zeroed 3 MiB of RAM to hold 1.5 MiB
// (the reserver's madvise was 9 % of the server's CPU). A quarter slab
// left is warning enough for writes that keep coming; a burst that
// outruns it faults the rest in on the loop, as any write did before
// there was a reserver.
func (c *writeCache) wantsSlab() bool {
	n := int64(len(c.slabs))
	if c.closed || (n+1)*slabSize > c.ramLimit {
		return false
	}
	switch n {
	case 0:
		return true
	case 1:
		return c.ramBlocks > 0
	}
	return c.ramBlocks > (n-1)*slabBlocks+slabBlocks*3/4
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
	faulted := unix.Madvise(slab, unix.MADV_POPULATE_WRITE) == nil
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.slabs) != n {
		_ = syscall.Munmap(slab) // the cache mapped one itself meanwhile
		return
	}
	c.slabs = append(c.slabs, slab)
	c.faulted = append(c.faulted, faulted)
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
