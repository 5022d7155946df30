package bootstorm

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/deskway/deskway/internal/bench/nbdfloor"
)

// TestFloorAnswersEveryClient runs many copying clients with reads,
// writes and flushes in flight against the floor responder: every read
// byte is the base's (writes are not stored), and every client finishes,
// which a reply stuck behind a short sendfile would prevent.
func TestFloorAnswersEveryClient(t *testing.T) {
	const size = 8 << 20
	dir := t.TempDir()
	path, err := makeBase(dir, size)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Clean(path))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- (&nbdfloor.Server{Base: f, Log: slog.New(slog.DiscardHandler)}).Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	check := func(off int64, p []byte) error {
		if !bytes.Equal(p, want[off:off+int64(len(p))]) {
			return fmt.Errorf("%d bytes at %d differ from the base", len(p), off)
		}
		return nil
	}
	var jobs []job
	var total int64
	for i := range 64 {
		ops := randomReads(int64(i), 40, size)
		for k := range ops {
			// Reads of megabytes outgrow the socket's buffer, so their
			// data goes out in several sends.
			if k%5 == 1 {
				ops[k] = op{cmd: 'R', off: int64(k) << 16, n: 4 << 20}
			} else if k%7 == 3 {
				ops[k].cmd = 'W'
			} else if k%11 == 5 {
				ops[k] = op{cmd: 'F'}
			}
		}
		for _, o := range ops {
			if o.cmd == 'R' {
				total += int64(o.n)
			}
		}
		jobs = append(jobs, job{addr: ln.Addr().String(), ops: ops, depth: 4, latencies: true})
	}
	got := int64(0)
	for i, r := range runFleet(t, false, check, jobs) {
		if r.err != nil {
			t.Fatalf("client %d: %v", i, r.err)
		}
		got += r.reads
	}
	if got != total {
		t.Fatalf("read %d bytes, want %d", got, total)
	}
}
