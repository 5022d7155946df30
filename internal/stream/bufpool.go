package stream

import "sync"

// bufPool recycles request buffers in power-of-two size classes from
// 4 KiB to 4 MiB: a boot storm moves gigabytes through buffers that would
// otherwise each be a fresh allocation for the garbage collector.
type bufPool struct {
	classes [11]sync.Pool // 4 KiB << i
}

func classOf(n int) int {
	c, size := 0, 4096
	for size < n {
		size <<= 1
		c++
	}
	return c
}

// get returns a buffer of length n; its contents are undefined.
func (p *bufPool) get(n int) []byte {
	c := classOf(n)
	if c >= len(p.classes) {
		return make([]byte, n)
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, 4096<<c)
}

// put gives b back; b must not be used afterwards.
func (p *bufPool) put(b []byte) {
	c := classOf(cap(b))
	if c >= len(p.classes) || cap(b) != 4096<<c {
		return
	}
	b = b[:cap(b)]
	p.classes[c].Put(&b)
}
