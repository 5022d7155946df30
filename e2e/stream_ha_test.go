package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/testkit"
)

const haConfig = `state_dir: %[1]s
log: {level: info, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
stream:
  listen: "127.0.0.1:%[3]d"
  tls: "off"
  clients: open
  store: %[4]s
  shared_cache: true
  reconnect_window: 1m
  vdisks:
  - {name: golden, base: %[5]s}
`

// haPair is two deskway stream servers on one shared store.
type haPair struct {
	base, store   string
	addrs, admins [2]string
	procs         [2]*testkit.Process
}

// startHAPair writes an 8 MiB base image and starts two servers sharing
// a store, with reconnect_window set to window.
func startHAPair(t *testing.T, window string) *haPair {
	t.Helper()
	bin := build(t)
	dir := t.TempDir()
	h := &haPair{base: filepath.Join(dir, "golden.img"), store: filepath.Join(dir, "store")}
	if err := os.WriteFile(h.base, bytes.Repeat([]byte("base"), 8<<20/4), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range h.procs {
		port, adminPort := testkit.FreePort(t), testkit.FreePort(t)
		cfg := filepath.Join(dir, fmt.Sprintf("node%d.yaml", i))
		body := strings.Replace(fmt.Sprintf(haConfig, filepath.Join(dir, fmt.Sprintf("state%d", i)), adminPort, port, h.store, h.base),
			"reconnect_window: 1m", "reconnect_window: "+window, 1)
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		h.procs[i] = testkit.Start(t, nil, bin, "stream", "-c", cfg)
		h.addrs[i], h.admins[i] = fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("https://127.0.0.1:%d", adminPort)
		if err := testkit.WaitPort(h.addrs[i], 10*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, h.procs[i].Log.String())
		}
	}
	return h
}

// uri is the NBD URI of export on server i.
func (h *haPair) uri(i int, export string) string { return "nbd://" + h.addrs[i] + "/" + export }

// kill ends server i with SIGKILL.
func (h *haPair) kill(t *testing.T, i int) {
	t.Helper()
	if err := h.procs[i].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = h.procs[i].Cmd.Process.Wait()
}

// TestStreamFailover runs two servers on one shared store, kills the one
// a client is writing through, and checks on the other that every write
// the first acknowledged is there, read by the Go client and by qemu-io.
func TestStreamFailover(t *testing.T) {
	testkit.Require(t, "nbdcopy", "strace")
	h := startHAPair(t, "1m")
	base, store, addrs, procs := h.base, h.store, h.addrs, h.procs
	sum := fileSum(t, base)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const export = "golden/vm7/boot42"
	c, err := nbdclient.Dial(ctx, addrs[0], export, nbdclient.Options{Structured: true})
	if err != nil {
		t.Fatal(err)
	}
	// Eight writers, 16 KiB blocks with a pattern naming the block; the
	// server dies while they are writing.
	const block = 16 << 10
	pattern := func(i int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("blk%05d", i)), block/8)
	}
	var mu sync.Mutex
	acked := map[int]bool{}
	var killed atomic.Bool
	var early error // a write that failed before the kill
	var wg sync.WaitGroup
	next := make(chan int)
	go func() {
		defer close(next)
		for i := 0; i < 8<<20/block; i++ {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := c.WriteAt(pattern(i), int64(i)*block, false); err != nil {
					if !killed.Load() {
						mu.Lock()
						early = fmt.Errorf("write %d before the kill: %w", i, err)
						mu.Unlock()
					}
					return
				}
				mu.Lock()
				acked[i] = true
				mu.Unlock()
			}
		}()
	}
	for {
		mu.Lock()
		n, err := len(acked), early
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if n >= 100 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("only %d writes acknowledged in a minute\n%s", n, procs[0].Log.String())
		}
		time.Sleep(time.Millisecond)
	}
	killed.Store(true)
	if err := procs[0].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if early != nil {
		t.Fatal(early)
	}
	c.Drop()
	mu.Lock()
	total := len(acked)
	mu.Unlock()
	if total == 8<<20/block {
		t.Fatal("every write finished before the server died; the test proved nothing")
	}
	t.Logf("%d writes acknowledged before the kill", total)

	// The client reconnects to the other server under the same name.
	c2, err := nbdclient.Dial(ctx, addrs[1], export, nbdclient.Options{Structured: true})
	if err != nil {
		t.Fatalf("takeover: %v\n%s", err, procs[1].Log.String())
	}
	got := make([]byte, block)
	for i := range acked {
		if _, err := c2.ReadAt(got, int64(i)*block); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, pattern(i)) {
			t.Fatalf("acknowledged write %d lost in the failover: %q…", i, got[:16])
		}
	}
	// A real client sees the same: nbdcopy the boot's disk (a reader,
	// whose clean disconnect does not end the client's boot).
	copyTo := filepath.Join(t.TempDir(), "copy.img")
	runOK(t, "nbdcopy", fmt.Sprintf("nbd://%s/%s", addrs[1], export), copyTo)
	img, err := os.ReadFile(copyTo)
	if err != nil {
		t.Fatal(err)
	}
	for i := range acked {
		if !bytes.Equal(img[i*block:(i+1)*block], pattern(i)) {
			t.Fatalf("nbdcopy: acknowledged write %d missing", i)
		}
	}
	// FUA and FLUSH reach the disk: the server syncs the cache's files
	// before it answers them (seen by strace on the server).
	syncs := filepath.Join(t.TempDir(), "strace.out")
	tracer := exec.Command("strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,sync_file_range", "-o", syncs,
		"-p", fmt.Sprint(procs[1].Cmd.Process.Pid))
	if err := tracer.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // strace attaches to every thread
	countSyncs := func() int {
		b, _ := os.ReadFile(syncs)
		return strings.Count(string(b), "fsync(") + strings.Count(string(b), "fdatasync(")
	}
	before := countSyncs()
	if err := c2.WriteAt(pattern(1), block, true); err != nil {
		t.Fatal(err)
	}
	afterFUA := countSyncs()
	if err := c2.WriteAt(pattern(2), 2*block, false); err != nil {
		t.Fatal(err)
	}
	if err := c2.Flush(); err != nil {
		t.Fatal(err)
	}
	afterFlush := countSyncs()
	_ = tracer.Process.Signal(syscall.SIGINT)
	_ = tracer.Wait()
	if afterFUA <= before || afterFlush <= afterFUA {
		b, _ := os.ReadFile(syncs)
		t.Fatalf("syncs: %d before, %d after a FUA write, %d after a FLUSH; each must sync\n%s", before, afterFUA, afterFlush, b)
	}
	// The client writes once more and leaves cleanly: its boot ends.
	if err := c2.WriteAt(pattern(0), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(store, "cache", "golden", "vm7", "boot42")); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("write cache still on the store after the boot ended\n%s", procs[1].Log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if fileSum(t, base) != sum {
		t.Fatal("base image changed")
	}
}

// TestStreamFailoverKeepsTheVersion: a boot started on version 0; version
// 1 reaches production; the boot's server dies. On the other server the
// client must go on reading version 0 under its writes, not version 1.
func TestStreamFailoverKeepsTheVersion(t *testing.T) {
	h := startHAPair(t, "1m")
	uri, admins := h.uri, h.admins
	// The boot writes one block on server 0 and its connection drops.
	killedAfterWrite(t, uri(0, "golden/vmV/b1"), "write -P 0x5a 0 4096")
	// Version 1 changes another block and goes to production.
	admin := func(path string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, admins[0]+path, nil)
		req.Header.Set("Authorization", "Bearer tok")
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("POST %s: %s", path, resp.Status)
		}
	}
	admin("/api/v1/stream/vdisks/golden/versions")
	if ok, out := qemuIO(t, uri(0, "golden@maintenance/admin"), false, "write -P 0x77 65536 4096"); !ok {
		t.Fatalf("maintenance write:\n%s", out)
	}
	admin("/api/v1/stream/vdisks/golden/versions/1/promote")
	admin("/api/v1/stream/vdisks/golden/versions/1/promote")
	if ok, out := qemuIO(t, uri(1, "golden/vmN/b1"), true, "read -P 0x77 65536 4096"); !ok {
		t.Fatalf("a new boot does not see production version 1:\n%s", out)
	}
	// Server 0 dies; the boot goes on on server 1, on version 0.
	h.kill(t, 0)
	ok, out := qemuIO(t, uri(1, "golden/vmV/b1"), true, "read -P 0x5a 0 4096", "read -v 65536 16")
	if !ok || strings.Contains(out, "77 77 77") || !strings.Contains(out, "62 61 73 65") {
		t.Fatalf("after the takeover the boot reads another version (or lost its write):\n%s", out)
	}
}

// TestStreamSweepsOrphanedCaches: a boot whose server died and whose
// client never came back is discarded by the surviving server after the
// reconnect window, and the client, if it does come back, is refused with
// the reason; a boot a live server serves is never swept, however long.
func TestStreamSweepsOrphanedCaches(t *testing.T) {
	h := startHAPair(t, "2s")
	uri, store, procs := h.uri, h.store, h.procs
	// A long-lived boot on server 1, connected the whole time.
	live := exec.Command("qemu-io", "-f", "raw", "-c", "write -P 0x11 0 4096", "-c", "sleep 6000", "-c", "read -P 0x11 0 4096", uri(1, "golden/vmL/b1"))
	var liveOut testkit.Buffer
	live.Stdout, live.Stderr = &liveOut, &liveOut
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	// A boot on server 0, whose server dies and whose client never returns.
	killedAfterWrite(t, uri(0, "golden/vmO/b1"), "write -P 0x22 0 4096")
	h.kill(t, 0)
	orphan := filepath.Join(store, "cache", "golden", "vmO", "b1")
	deadline := time.Now().Add(8 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(orphan, "data")); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphaned cache was never swept\n%s", procs[1].Log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if ok, out := qemuIO(t, uri(1, "golden/vmO/b1"), true, "read 0 4096"); ok || !strings.Contains(out, "lost its write cache") {
		t.Fatalf("a swept boot was served, or refused without the reason:\n%s", out)
	}
	if err := live.Wait(); err != nil || strings.Contains(liveOut.String(), "failed") {
		t.Fatalf("the live boot lost its cache to the sweeper: %v\n%s", err, liveOut.String())
	}
}

// TestStreamTakeoverOutlivesTheFirstWindow: a boot's connection to server
// 0 drops and the client goes on on server 1. When server 0's reconnect
// window for the boot ends, it must leave the cache alone: server 1 owns
// it now, and the client's writes live there.
func TestStreamTakeoverOutlivesTheFirstWindow(t *testing.T) {
	h := startHAPair(t, "2s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const export = "golden/vmT/b1"
	c, err := nbdclient.Dial(ctx, h.addrs[0], export, nbdclient.Options{Structured: true})
	if err != nil {
		t.Fatal(err)
	}
	first := bytes.Repeat([]byte("one!"), 1024)
	if err := c.WriteAt(first, 0, true); err != nil {
		t.Fatal(err)
	}
	c.Drop() // the network drops: no NBD_CMD_DISC
	// Until server 0 sees the drop it still holds the cache: the client
	// retries, as qemu's reconnect-delay does.
	var c2 *nbdclient.Client
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c2, err = nbdclient.Dial(ctx, h.addrs[1], export, nbdclient.Options{Structured: true}); err == nil {
			break
		}
		if !strings.Contains(err.Error(), "open on another server") || time.Now().After(deadline) {
			t.Fatalf("takeover: %v\n%s", err, h.procs[1].Log.String())
		}
	}
	defer c2.Close()
	// Past server 0's window, with the client still writing on server 1.
	second := bytes.Repeat([]byte("two!"), 1024)
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
		if err := c2.WriteAt(second, 4096, false); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	got := make([]byte, 8192)
	if _, err := c2.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:4096], first) || !bytes.Equal(got[4096:], second) {
		t.Fatalf("after server 0's window the boot lost its writes\nserver 0:\n%s", h.procs[0].Log.String())
	}
	if _, err := os.Stat(filepath.Join(h.store, "cache", "golden", "vmT", "b1", "data")); err != nil {
		t.Fatalf("the cache server 1 serves is gone from the store: %v\nserver 0:\n%s", err, h.procs[0].Log.String())
	}
}
