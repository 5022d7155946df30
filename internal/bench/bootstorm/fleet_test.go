package bootstorm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// startPeer serves a fresh random base of size bytes with nbdkit's cow
// filter (a real NBD server, writable, simple replies by default) and
// returns its address and the base's bytes.
func startPeer(t *testing.T, size int64) (string, []byte) {
	t.Helper()
	testkit.Require(t, "nbdkit")
	dir := t.TempDir()
	base, err := makeBase(dir, size)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	sys, err := nbdkitCow()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sys.start(dir, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.stop)
	return srv.addr, want
}

// randomReads are n reads of 1 byte to 300 KiB (past the loop's 256 KiB
// buffer) inside size bytes.
func randomReads(seed int64, n int, size int64) []op {
	rng := rand.New(rand.NewSource(seed))
	ops := make([]op, n)
	for i := range ops {
		l := 1 + rng.Int63n(300<<10)
		ops[i] = op{cmd: 'R', off: rng.Int63n(size - l), n: uint32(l)}
	}
	return ops
}

func runFleet(t *testing.T, discard bool, check func(int64, []byte) error, jobs []job) []clientResult {
	t.Helper()
	f, err := newFleet(discard, 300<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	f.check = check
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return f.run(ctx, jobs)
}

// TestFleetReadsTheRightBytes checks every byte copying clients receive
// against the base, many clients and requests in flight at once: the
// reply parser keeps headers and data apart across reads of any split.
func TestFleetReadsTheRightBytes(t *testing.T) {
	const size = 8 << 20
	addr, want := startPeer(t, size)
	var mu sync.Mutex
	checked := int64(0)
	check := func(off int64, p []byte) error {
		if !bytes.Equal(p, want[off:off+int64(len(p))]) {
			return fmt.Errorf("%d bytes at %d differ from the base", len(p), off)
		}
		mu.Lock()
		checked += int64(len(p))
		mu.Unlock()
		return nil
	}
	var jobs []job
	var total int64
	for i := range 8 {
		ops := randomReads(int64(i), 60, size)
		for _, o := range ops {
			total += int64(o.n)
		}
		jobs = append(jobs, job{addr: addr, ops: ops, depth: 1 + i%5, latencies: true})
	}
	got := int64(0)
	for i, r := range runFleet(t, false, check, jobs) {
		if r.err != nil {
			t.Fatalf("client %d: %v", i, r.err)
		}
		for k, l := range r.lat {
			if l <= 0 {
				t.Fatalf("client %d request %d has no latency", i, k)
			}
		}
		got += r.reads
	}
	if got != total || checked != total {
		t.Fatalf("read %d bytes and checked %d, want %d", got, checked, total)
	}
}

// TestFleetDiscardKeepsTheStream drops read data in the kernel: if a
// client dropped a byte too many or too few, the next reply's header
// would not parse. A flush after the reads proves the stream still in
// step, and every byte is counted.
func TestFleetDiscardKeepsTheStream(t *testing.T) {
	const size = 8 << 20
	addr, _ := startPeer(t, size)
	var jobs []job
	var total int64
	for i := range 6 {
		ops := append(randomReads(int64(10+i), 80, size), op{cmd: 'F'})
		for _, o := range ops {
			if o.cmd == 'R' {
				total += int64(o.n)
			}
		}
		jobs = append(jobs, job{addr: addr, ops: ops, depth: 4})
	}
	got := int64(0)
	for i, r := range runFleet(t, true, nil, jobs) {
		if r.err != nil {
			t.Fatalf("client %d: %v", i, r.err)
		}
		got += r.reads
	}
	if got != total {
		t.Fatalf("dropped %d bytes, want %d", got, total)
	}
}

// TestFleetReplaysTheWholeTrace boots the committed trace's first
// requests (writes, zeroes and flushes among them), paced: the boot
// cannot end before its last request's time, and each request has its
// latency.
func TestFleetReplaysTheWholeTrace(t *testing.T) {
	tr, err := parseTrace(defaultTrace)
	if err != nil {
		t.Fatal(err)
	}
	ops := tr.ops[:600]
	kinds := map[byte]bool{}
	var end int64
	for _, o := range ops {
		kinds[o.cmd] = true
		end = max(end, o.off+int64(o.n))
	}
	if !kinds['W'] || !kinds['Z'] || !kinds['F'] {
		t.Fatalf("the first 600 requests have only %v", kinds)
	}
	addr, _ := startPeer(t, end)
	// Fast forward: the trace's 600th request is seconds in.
	const scale = 0.05
	span := time.Duration(float64(ops[len(ops)-1].at) * scale)
	res := runFleet(t, false, nil, []job{
		{addr: addr, ops: ops, depth: 4, scale: scale, latencies: true},
		{addr: addr, ops: ops, depth: 1, scale: scale, latencies: true},
	})
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("client %d: %v", i, r.err)
		}
		if r.took < span {
			t.Fatalf("client %d booted in %v, before its last request was due (%v)", i, r.took, span)
		}
		if r.reads == 0 {
			t.Fatalf("client %d read nothing", i)
		}
		for k, l := range r.lat {
			if l <= 0 {
				t.Fatalf("client %d request %d (%c) has no latency", i, k, ops[k].cmd)
			}
		}
	}
}

// TestFleetReportsServerErrors reads past the end: the client reports
// the server's error and still finishes its other requests.
func TestFleetReportsServerErrors(t *testing.T) {
	const size = 1 << 20
	addr, _ := startPeer(t, size)
	ops := []op{{cmd: 'R', off: 0, n: 4096}, {cmd: 'R', off: size, n: 4096}, {cmd: 'R', off: 4096, n: 4096}}
	r := runFleet(t, false, nil, []job{{addr: addr, ops: ops, depth: 1}})[0]
	if r.err == nil {
		t.Fatal("a read past the end gave no error")
	}
	if r.reads != 8192 {
		t.Fatalf("read %d bytes around the failed request, want 8192", r.reads)
	}
}

// TestFleetStopsWithTheContext ends a read test that would run for an
// hour by cancelling its context.
func TestFleetStopsWithTheContext(t *testing.T) {
	addr, _ := startPeer(t, 1<<20)
	f, err := newFleet(false, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := f.run(ctx, []job{{addr: addr, ops: []op{{cmd: 'R', n: 4096}}, depth: 2, cycle: true, runFor: time.Hour}})
	if !errors.Is(res[0].err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's", res[0].err)
	}
	if res[0].reads == 0 {
		t.Fatal("the reader read nothing before it was stopped")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("stopping took %v", d)
	}
}
