package stream

import (
	"io"
	"os"
)

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
