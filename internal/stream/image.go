package stream

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// image is one version of a vDisk as clients read it: a full base file
// and the deltas above it, newest first. An image never changes once
// built: a boot keeps the image it started with while newer versions
// are promoted.
type image struct {
	version int
	base    *os.File
	baseFD  int
	size    int64
	deltas  []*delta // newest first
}

// delta is one version's changes: written blocks at their own offsets in
// a sparse data file, and a bitmap of which blocks are there (the format
// of the shared write cache).
type delta struct {
	version int
	data    *os.File
	bitmap  []byte
}

func (d *delta) has(blk int64) bool {
	i := blk / 8
	return i < int64(len(d.bitmap)) && d.bitmap[i]&(1<<(blk%8)) != 0
}

// loadDelta opens a finished delta read-only.
func loadDelta(dir string, version int, size int64) (*delta, error) {
	data, err := os.Open(filepath.Join(dir, "data"))
	if err != nil {
		return nil, fmt.Errorf("version %d: %w", version, err)
	}
	bitmap := make([]byte, (size/cacheBlock+8)/8)
	mp, err := os.Open(filepath.Join(dir, "map"))
	if err != nil {
		data.Close()
		return nil, fmt.Errorf("version %d: %w", version, err)
	}
	defer mp.Close()
	if _, err := mp.ReadAt(bitmap, 0); err != nil && !errors.Is(err, io.EOF) {
		data.Close()
		return nil, fmt.Errorf("version %d map: %w", version, err)
	}
	return &delta{version: version, data: data, bitmap: bitmap}, nil
}

// layer returns the index of the newest delta holding blk, or -1 for the base.
func (im *image) layer(blk int64) int {
	for i, d := range im.deltas {
		if d.has(blk) {
			return i
		}
	}
	return -1
}

// ReadAt reads the version, a run of blocks from the same layer at a time.
func (im *image) ReadAt(p []byte, off int64) (int, error) {
	if len(im.deltas) == 0 {
		return readFull(im.base, p, off)
	}
	end := off + int64(len(p))
	for pos := off; pos < end; {
		blk := pos / cacheBlock
		l := im.layer(blk)
		runEnd := (blk + 1) * cacheBlock
		for runEnd < end && im.layer(runEnd/cacheBlock) == l {
			runEnd += cacheBlock
		}
		runEnd = min(runEnd, end)
		var src io.ReaderAt = im.base
		if l >= 0 {
			src = im.deltas[l].data
		}
		if _, err := readFull(src, p[pos-off:runEnd-off], pos); err != nil {
			return int(pos - off), err
		}
		pos = runEnd
	}
	return len(p), nil
}

// baseFile reports whether [off, off+n) comes from the base file alone,
// which can then be sent with sendfile from baseFD.
func (im *image) baseFile(off, n int64) bool {
	for _, d := range im.deltas {
		for blk := off / cacheBlock; blk*cacheBlock < off+n; blk++ {
			if d.has(blk) {
				return false
			}
		}
	}
	return true
}

// flatten writes the image as one file at path: the base copied sparsely
// in the kernel, then each block some delta holds, once, from the newest
// delta holding it. Runs of blocks from one delta move with
// copy_file_range too, so nothing passes through user space on a
// filesystem that supports it. The file appears complete or not at all.
func (im *image) flatten(path string) error {
	return sparseCopy(path, im.base, im.size, func(out *os.File) error {
		// Own descriptors: copying moves a file's offset, and the
		// shared ones are read with pread by booting clients meanwhile.
		srcs := make([]*os.File, len(im.deltas))
		defer func() {
			for _, f := range srcs {
				if f != nil {
					f.Close()
				}
			}
		}()
		blocks := (im.size + cacheBlock - 1) / cacheBlock
		for blk := int64(0); blk < blocks; {
			l := im.layer(blk)
			end := blk + 1
			for end < blocks && im.layer(end) == l {
				end++
			}
			if l >= 0 {
				if srcs[l] == nil {
					f, err := os.Open(im.deltas[l].data.Name())
					if err != nil {
						return err
					}
					srcs[l] = f
				}
				off := blk * cacheBlock
				if err := copyRange(out, srcs[l], off, min(end*cacheBlock, im.size)-off); err != nil {
					return fmt.Errorf("version %d, blocks %d to %d: %w", im.deltas[l].version, blk, end-1, err)
				}
			}
			blk = end
		}
		return nil
	})
}
