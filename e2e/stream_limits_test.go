package e2e

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
	"github.com/deskway/deskway/internal/testkit"
)

// TestStreamGreedyReadersAreBounded: clients that ask for the largest
// reads the server allows and never read a reply must not make it hold
// what they asked for: over TLS (served by goroutines) and on plain TCP
// (served on event loops, from a write cache so no sendfile applies).
func TestStreamGreedyReadersAreBounded(t *testing.T) {
	parallel(t) // its servers' own memory, on ports the kernel chose
	_, clientTLS, cert, key := testkit.TLS(t)
	for _, tc := range []struct {
		name  string
		tls   bool
		conns int
		extra string // more stream settings
		limit int64  // growth allowed
	}{
		{"tls", true, 4, "", 400 << 20},                                  // four connections of at most 64 MiB each, and TLS buffers
		{"plain", false, 24, "", 400 << 20},                              // event loops send a cached READ 1 MiB at a time
		{"all connections", true, 8, "  max_buffer_mb: 64\n", 200 << 20}, // 64 MiB over all of them, not 8 × 64
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startStreamWith(t, "on", "1m", cert, key, "open", tc.extra)
			pid := r.log.Cmd.Process.Pid
			export := "golden/greedy/boot1"
			// Data in the boot's write cache: reads over it are copied.
			if ok, out := qemuIO(t, r.uri+"/"+export, false, "write -P 0x42 0 65536", "write -P 0x42 33554432 65536", "sigraise 9"); ok {
				t.Fatalf("qemu-io should have been killed after writing:\n%s", out)
			}
			before := rssOf(t, pid)
			for i := range tc.conns {
				raw, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				_ = raw.(*net.TCPConn).SetReadBuffer(4096)
				t.Cleanup(func() { raw.Close() })
				o := nbdclient.Options{}
				if tc.tls {
					o.TLS = clientTLS
				}
				conn, _, err := nbdclient.Handshake(raw, export, o)
				if err != nil {
					t.Fatal(err)
				}
				var reqs []byte
				for k := range 16 {
					req := nbd.Request{Cmd: nbd.CmdRead, Cookie: uint64(i*100 + k), Offset: uint64(k%2) << 25, Length: 32 << 20}
					reqs = req.Append(reqs)
				}
				if _, err := conn.Write(reqs); err != nil {
					t.Fatal(err)
				}
			}
			var peak int64
			for range 30 {
				time.Sleep(100 * time.Millisecond)
				peak = max(peak, rssOf(t, pid))
			}
			grown := peak - before
			t.Logf("RSS %d MiB before, %d MiB at peak with %d connections of 16 unread 32 MiB reads", before>>20, peak>>20, tc.conns)
			if grown > tc.limit {
				t.Fatalf("the server grew by %d MiB for clients that read nothing (at most %d MiB allowed)", grown>>20, tc.limit>>20)
			}
			// The server still serves a well-behaved client meanwhile.
			if ok, out := qemuIO(t, r.uri+"/golden/other/boot1", true, "read -P 0 63m 4096"); !ok {
				t.Fatalf("a normal client is not served:\n%s", out)
			}
		})
	}
}

// TestStreamOddRequests: requests a client may legally send get the
// answers nbdkit gives, and the connection carries on.
func TestStreamOddRequests(t *testing.T) {
	r := startStream(t, "off", "1m")
	out, err := nbdsh(t, r.uri+"/golden/odd/b1", `
h.pwrite(b"", 4096)
assert len(h.pread(0, 4096)) == 0
try:
    h.trim(8192, h.get_size() - 4096)
    print("trim past the end: accepted")
except nbd.Error as e:
    print("trim past the end:", e.errno)
h.pwrite(b"x" * 512, 0)
assert h.pread(512, 0) == b"x" * 512
print("still connected")
`)
	if err != nil || !strings.Contains(out, "trim past the end: EINVAL") || !strings.Contains(out, "still connected") {
		t.Fatalf("odd requests: %v\n%s", err, out)
	}
	// A stage names another boot: golden@v0/pc/b1 is not golden/pc/b1.
	if ok, out := qemuIO(t, r.uri+"/golden/stage/b1", false, "write -P 0x61 0 4096", "sigraise 9"); ok || !strings.Contains(out, "wrote 4096/4096") {
		t.Fatalf("write:\n%s", out)
	}
	expectMismatch(t, r.uri+"/golden@v0/stage/b1", "read -P 0x61 0 4096", "golden@v0/stage/b1 reads golden/stage/b1's write")
	// ...but spellings of one stage name one boot: golden@production is
	// golden, and golden@v00 is golden@v0.
	for _, same := range [][2]string{{"golden/stage/b1", "golden@production/stage/b1"}, {"golden@v0/stage/b2", "golden@v00/stage/b2"}} {
		if ok, out := qemuIO(t, r.uri+"/"+same[0], false, "write -P 0x62 8192 4096", "sigraise 9"); ok || !strings.Contains(out, "wrote 4096/4096") {
			t.Fatalf("write to %s:\n%s", same[0], out)
		}
		if ok, out := qemuIO(t, r.uri+"/"+same[1], true, "read -P 0x62 8192 4096"); !ok {
			t.Fatalf("%s does not read %s's write:\n%s", same[1], same[0], out)
		}
	}
}

// TestStreamBootCapInAll: many client names together cannot make the
// server hold more live boots than stream.max_boots.
func TestStreamBootCapInAll(t *testing.T) {
	_, _, cert, key := testkit.TLS(t)
	r := startStreamWith(t, "off", "1m", cert, key, "open", "  max_boots: 2\n")
	for _, c := range []string{"pcA", "pcB"} {
		killedAfterWrite(t, r.uri+"/golden/"+c+"/b1", "write -P 0x01 0 512")
	}
	expectRefused(t, r.uri+"/golden/pcC/b1", true, "max_boots", "a third live boot with max_boots 2", "read 0 512")
	// The base's read-only view is no boot, and stays open to all.
	if ok, out := qemuIO(t, r.uri+"/golden", true, "read 0 512"); !ok {
		t.Fatalf("the base's view with every boot slot taken:\n%s", out)
	}
}

// TestStreamSecondConnectionDoesNotEndTheBoot: a boot ends when its last
// connection leaves cleanly after writing. A second connection of the
// boot that writes and leaves cleanly while the first is still connected
// must not end it: the first one's writes stay, and so do the second's.
func TestStreamSecondConnectionDoesNotEndTheBoot(t *testing.T) {
	r := startStream(t, "off", "1m")
	a := r.uri + "/golden/vmS/boot1"
	port := strings.TrimPrefix(r.uri, "nbd://127.0.0.1:")
	// Line-buffered, so that its output shows the write as it happens.
	first := exec.Command("stdbuf", "-oL", "qemu-io", "--image-opts",
		"-c", "write -P 0x11 0 4096", "-c", "sleep 2000", "-c", "read -P 0x11 0 4096", "-c", "read -P 0x22 65536 4096",
		"driver=raw,file.driver=nbd,file.host=127.0.0.1,file.port="+port+",file.export=golden/vmS/boot1")
	var out testkit.Buffer
	first.Stdout, first.Stderr = &out, &out
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "wrote 4096/4096") {
		if time.Now().After(deadline) {
			t.Fatalf("the first connection never wrote:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, o := qemuIO(t, a, false, "write -P 0x22 65536 4096"); !ok {
		t.Fatalf("the second connection's write:\n%s", o)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first connection: %v\n%s", err, out.String())
	}
	if s := out.String(); strings.Count(s, "read 4096/4096") != 2 || strings.Contains(s, "failed") {
		t.Fatalf("after a second connection wrote and left, the first one's boot lost writes:\n%s", s)
	}
}

// TestStreamBootCaps: one client name cannot make the server hold boots
// (each with a write cache) without end.
func TestStreamBootCaps(t *testing.T) {
	r := startStream(t, "off", "1m") // stream.max_boots_per_client: 4 by default
	for i := range 4 {
		killedAfterWrite(t, fmt.Sprintf("%s/golden/greedy/b%d", r.uri, i), "write -P 0x01 0 512")
	}
	if ok, out := qemuIO(t, r.uri+"/golden/greedy/b9", true, "read 0 512"); ok || !strings.Contains(out, "max_boots_per_client") {
		t.Fatalf("a fifth live boot of one client was accepted, or refused without the reason:\n%s", out)
	}
	if ok, out := qemuIO(t, r.uri+"/golden/modest/b1", true, "read 0 512"); !ok {
		t.Fatalf("another client was refused:\n%s", out)
	}
}

// TestStreamCacheQuota: one client, or all of them together, cannot make
// the server hold write-cache bytes without end. A write past a cap fails
// with ENOSPC and the server's reason, as on a full disk; what the client
// wrote before stays, rewriting it and zeroing whole blocks still work,
// and the bytes come back when a boot ends.
func TestStreamCacheQuota(t *testing.T) {
	t.Run("RAM and spill", func(t *testing.T) { testCacheQuota(t, "") })
	t.Run("shared cache", func(t *testing.T) { testCacheQuota(t, "  shared_cache: true\n") })
}

func testCacheQuota(t *testing.T, extra string) {
	_, _, cert, key := testkit.TLS(t)
	r := startStreamWith(t, "off", "1m", cert, key, "open", extra+"  max_cache_mb: 2\n  max_cache_mb_per_client: 1\n")
	// A session that leaves without NBD_CMD_DISC keeps its boot alive.
	const hangUp = "\nimport os\nos._exit(0)\n"
	try := func(what string) string {
		return fmt.Sprintf(`
try:
    %s
    print("ok")
except nbd.Error as e:
    print("refused:", e.errno, e.string)
`, what)
	}
	out, err := nbdsh(t, r.uri+"/golden/filler/b1", `
h.pwrite(b"a" * (1 << 20), 0)
`+try(`h.pwrite(b"b" * 4096, 8 << 20)`)+`
h.pwrite(b"c" * (1 << 20), 0)
h.zero(1 << 20, 4 << 20)
assert h.pread(1 << 20, 0) == b"c" * (1 << 20)
assert h.pread(4096, 8 << 20) == bytes(4096)
print("rewrote")
`+hangUp)
	if err != nil || !strings.Contains(out, "refused: ENOSPC") || !strings.Contains(out, "rewrote") {
		t.Fatalf("per-client cap: %v\n%s", err, out)
	}
	if !strings.Contains(r.log.Log.String(), "max_cache_mb_per_client") {
		t.Errorf("the refusal does not name stream.max_cache_mb_per_client in the server log:\n%s", r.log.Log.String())
	}
	if out, err := nbdsh(t, r.uri+"/golden/other/b1", `h.pwrite(b"o" * (1 << 20), 0)`+hangUp); err != nil {
		t.Fatalf("another client under its cap: %v\n%s", err, out)
	}
	out, err = nbdsh(t, r.uri+"/golden/third/b1", try(`h.pwrite(b"t" * 4096, 0)`)+hangUp)
	if err != nil || !strings.Contains(out, "refused: ENOSPC") {
		t.Fatalf("global cap: %v\n%s", err, out)
	}
	if !strings.Contains(r.log.Log.String(), "stream.max_cache_mb (2 MiB)") {
		t.Errorf("the refusal does not name stream.max_cache_mb in the server log:\n%s", r.log.Log.String())
	}
	// filler ends its boot cleanly: its megabyte is free again.
	if out, err := nbdsh(t, r.uri+"/golden/filler/b1", `
h.pwrite(b"c" * 4096, 0)
h.shutdown()
`); err != nil {
		t.Fatalf("ending filler's boot: %v\n%s", err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err = nbdsh(t, r.uri+"/golden/third/b1", try(`h.pwrite(b"t" * 4096, 0)`)+hangUp)
		if err == nil && strings.Contains(out, "ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bytes of an ended boot did not come back: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// floodFrom opens n TCP connections to addr from the loopback address src
// that send nothing, and says how many the server greeted (the rest it
// closed at once). The connections stay open until the test ends.
func floodFrom(t *testing.T, addr, src string, n int) (greeted int, conns []net.Conn) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			continue // the listen queue is full: as good as refused
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		magic := make([]byte, 8)
		if _, err := io.ReadFull(c, magic); err == nil && string(magic) == "NBDMAGIC" {
			greeted++
		}
	}
	return greeted, conns
}

// greets reports whether a new connection to addr gets the NBD greeting.
func greets(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	magic := make([]byte, 8)
	_, err = io.ReadFull(c, magic)
	return err == nil && string(magic) == "NBDMAGIC"
}

// TestStreamUnauthenticatedFloodCannotEndBoots: anyone who reaches the
// port can open connections that never negotiate. They are capped per
// source address and in all, and a server that runs out of descriptors
// waits and accepts again instead of stopping: stopping would end every
// live boot, whose writes then are lost.
func TestStreamUnauthenticatedFloodCannotEndBoots(t *testing.T) {
	// Its server is on a port the kernel chose; the descriptor limit it
	// lowers is that server's own.
	parallel(t)
	_, _, cert, key := testkit.TLS(t)
	r := startStreamWith(t, "off", "5m", cert, key, "open", "  max_unauthenticated: 24\n  max_unauthenticated_per_address: 8\n")
	a := r.uri + "/golden/vmF/boot1"
	killedAfterWrite(t, a, "write -P 0x5e 0 65536")

	t.Run("caps per address and in all", func(t *testing.T) {
		if greeted, _ := floodFrom(t, r.addr, "127.0.0.3", 40); greeted != 8 {
			t.Fatalf("one address holds %d negotiating connections, want the cap of 8", greeted)
		}
		floodFrom(t, r.addr, "127.0.0.4", 8)
		floodFrom(t, r.addr, "127.0.0.5", 8) // 24 in all now
		if greeted, _ := floodFrom(t, r.addr, "127.0.0.6", 4); greeted != 0 {
			t.Fatalf("%d connections greeted past the cap of 24 in all", greeted)
		}
		if !strings.Contains(r.log.Log.String(), "connection refused before negotiation") {
			t.Fatalf("refusals not logged:\n%s", r.log.Log.String())
		}
	})
	// The flood's connections are closed: the caps are free again, and
	// the boot (whose client comes from 127.0.0.1) reads its write.
	if ok, out := qemuIO(t, a, true, "read -P 0x5e 0 65536"); !ok {
		t.Fatalf("the boot's write after the flood:\n%s", out)
	}

	t.Run("out of descriptors", func(t *testing.T) {
		pid := r.log.Cmd.Process.Pid
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatal(err)
		}
		// Room for a few more descriptors only: the flood takes them all.
		// Only the soft limit is lowered, so that it can be raised again.
		soft := strings.TrimSpace(runOK(t, "prlimit", "--pid", fmt.Sprint(pid), "--nofile", "--output", "SOFT", "--noheadings"))
		runOK(t, "prlimit", "--pid", fmt.Sprint(pid), fmt.Sprintf("--nofile=%d:", len(fds)+4))
		var flood []net.Conn
		for _, src := range []string{"127.0.0.7", "127.0.0.8"} {
			_, cs := floodFrom(t, r.addr, src, 8)
			flood = append(flood, cs...)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(r.log.Log.String(), "accept failed; retrying") {
			if time.Now().After(deadline) {
				t.Fatalf("the server never ran out of descriptors:\n%s", r.log.Log.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, c := range flood {
			c.Close()
		}
		// With the flood's descriptors back the server greets again; a
		// server that gave up has exited by then.
		deadline = time.Now().Add(10 * time.Second)
		for !greets(r.addr) {
			if exited(t, pid) {
				t.Fatalf("the server stopped when it ran out of descriptors:\n%s", r.log.Log.String())
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server does not greet once descriptors are free again:\n%s", r.log.Log.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if exited(t, pid) {
			t.Fatalf("the server stopped when it ran out of descriptors:\n%s", r.log.Log.String())
		}
		runOK(t, "prlimit", "--pid", fmt.Sprint(pid), "--nofile="+soft+":")
		if ok, out := qemuIO(t, a, true, "read -P 0x5e 0 65536"); !ok {
			t.Fatalf("the boot after the server ran out of descriptors:\n%s", out)
		}
	})
}
