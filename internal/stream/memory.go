package stream

import (
	"github.com/deskway/deskway/internal/config"
)

// MemoryLimit is the Go memory limit (runtime/debug.SetMemoryLimit) for a
// process that serves cfg and nothing else: the request buffers it may
// hold (stream.max_buffer_mb) and a quarter more, at least 256 MiB, for
// the rest of the heap (connections, TLS, boot indexes). Buffers are
// dropped as fast as replies go out, and the garbage collector, left to
// its default, lets the heap grow to twice what is live before it
// collects: 1950 MiB of RSS for a full 1 GiB of buffers in
// e2e/TestStreamMemoryBoundUnderChurn, some 1.3 GiB with this limit.
// Write caches' RAM is mapped outside the Go heap and is not part of it.
func MemoryLimit(cfg *config.Stream) int64 {
	buffers := int64(cfg.MaxBufferMB) << 20
	return buffers + max(buffers/4, 256<<20)
}
