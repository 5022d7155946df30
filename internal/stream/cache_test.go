package stream

import (
	"bytes"
	"math/rand"
	"os"
	"testing"
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
	c := newWriteCache(bytes.NewReader(base), size, 16*cacheBlock, dir)
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
	ram, spilled := c.bytes()
	if ram != 16*cacheBlock || spilled == 0 {
		t.Errorf("ram %d spilled %d: the spill file was not used", ram, spilled)
	}
	if !bytes.Equal(base, orig) {
		t.Fatal("the base was written")
	}
	c.close()
	if _, err := c.ReadAt(got[:1], 0); err == nil {
		t.Error("read after close succeeded")
	}
	// The spill file was unlinked when it was made; nothing stays behind.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left in the spill directory: %v", ents)
	}
}
