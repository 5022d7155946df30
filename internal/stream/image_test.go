package stream

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestFlattenMatchesReads merges random delta chains over a sparse base
// and checks the merged file byte for byte against what the chain reads
// as: the newest delta wins each block, blocks no delta holds come from
// the base (holes included), and a delta whose data file ends early reads
// as zeroes past its end.
func TestFlattenMatchesReads(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 20; round++ {
		dir := t.TempDir()
		// A size that is not a whole number of blocks, so the last
		// block is partial.
		size := int64(40*cacheBlock + rng.IntN(cacheBlock-1) + 1)
		base, err := os.Create(filepath.Join(dir, "base"))
		if err != nil {
			t.Fatal(err)
		}
		// Data at the start and at the end of the base, a hole between.
		for _, at := range []int64{0, 30 * cacheBlock} {
			chunk := make([]byte, 5*cacheBlock+77)
			fillRand(rng, chunk)
			base.WriteAt(chunk, at)
		}
		base.Truncate(size)
		im := &image{base: base, baseFD: int(base.Fd()), size: size}
		for v := 3; v >= 1; v-- {
			d := &delta{version: v, bitmap: make([]byte, (size/cacheBlock+8)/8)}
			f, err := os.Create(filepath.Join(dir, "data"+string(rune('0'+v))))
			if err != nil {
				t.Fatal(err)
			}
			var last int64
			for blk := int64(0); blk*cacheBlock < size; blk++ {
				if rng.IntN(3) != 0 {
					continue
				}
				d.bitmap[blk/8] |= 1 << (blk % 8)
				b := make([]byte, cacheBlock)
				fillRand(rng, b)
				f.WriteAt(b, blk*cacheBlock)
				last = blk
			}
			// Sometimes the data file stops in the middle of its last block.
			if rng.IntN(2) == 0 {
				f.Truncate(last*cacheBlock + int64(rng.IntN(cacheBlock)))
			}
			d.data = f
			im.deltas = append(im.deltas, d)
		}
		want := make([]byte, size)
		if _, err := im.ReadAt(want, 0); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "merged")
		if err := im.flatten(out); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			i := 0
			for i < len(got) && i < len(want) && got[i] == want[i] {
				i++
			}
			t.Fatalf("round %d: merged file (%d bytes) differs from the chain (%d bytes) first at byte %d, block %d",
				round, len(got), len(want), i, i/cacheBlock)
		}
	}
}

func fillRand(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32()) | 1 // never zero, so a lost block shows
	}
}

// BenchmarkFlatten merges two deltas, each holding half of the blocks of
// a 256 MiB disk in runs of 16, one quarter held by both, into a new base.
func BenchmarkFlatten(b *testing.B) {
	dir := b.TempDir()
	const size = 256 << 20
	rng := rand.New(rand.NewPCG(5, 6))
	chunk := make([]byte, 1<<20)
	base, err := os.Create(filepath.Join(dir, "base"))
	if err != nil {
		b.Fatal(err)
	}
	for off := int64(0); off < size; off += int64(len(chunk)) {
		fillRand(rng, chunk)
		base.WriteAt(chunk, off)
	}
	im := &image{base: base, baseFD: int(base.Fd()), size: size}
	blk := make([]byte, cacheBlock)
	for v := 2; v >= 1; v-- {
		d := &delta{version: v, bitmap: make([]byte, (size/cacheBlock+8)/8)}
		d.data, err = os.Create(filepath.Join(dir, "data"+string(rune('0'+v))))
		if err != nil {
			b.Fatal(err)
		}
		for i := int64(0); i < size/cacheBlock; i++ {
			if r := (i / 16) % 4; r != int64(v) && r != int64(v)+1 {
				continue
			}
			d.bitmap[i/8] |= 1 << (i % 8)
			fillRand(rng, blk)
			d.data.WriteAt(blk, i*cacheBlock)
		}
		im.deltas = append(im.deltas, d)
	}
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := im.flatten(filepath.Join(dir, "merged")); err != nil {
			b.Fatal(err)
		}
	}
}
