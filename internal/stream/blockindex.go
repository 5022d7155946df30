package stream

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
