package stream

import (
	"bufio"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/proto/nbd"
)

// tracer appends every request of client boots to a CSV file.
type tracer struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

func newTracer(path string) (*tracer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("stream.trace: %w", err)
	}
	return &tracer{f: f, w: bufio.NewWriter(f)}, nil
}

var traceOps = map[nbd.Cmd]string{nbd.CmdRead: "R", nbd.CmdWrite: "W", nbd.CmdFlush: "F", nbd.CmdTrim: "T", nbd.CmdWriteZeroes: "Z"}

func (t *tracer) record(b *boot, req nbd.Request) {
	op, ok := traceOps[req.Cmd]
	if !ok {
		return
	}
	ms := float64(time.Since(b.started).Microseconds()) / 1000
	t.mu.Lock()
	fmt.Fprintf(t.w, "%s,%s,%.3f,%s,%d,%d\n", b.client, b.id, ms, op, req.Offset, req.Length)
	t.mu.Unlock()
}

// flush writes out what is buffered; called when a boot ends.
func (t *tracer) flush() {
	t.mu.Lock()
	_ = t.w.Flush()
	t.mu.Unlock()
}

func (t *tracer) close() {
	t.flush()
	_ = t.f.Close()
}
