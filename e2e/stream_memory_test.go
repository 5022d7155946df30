package e2e

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
	"github.com/deskway/deskway/internal/testkit"
)

// TestStreamMemoryBoundUnderChurn: clients that keep the server's
// request buffers full (stream.max_buffer_mb, 1 GiB by default) and read
// every reply make it allocate and drop a buffer per reply. Left to its
// default the garbage collector let the heap reach twice what was live
// (RSS 2.24 GB for 1 GiB of buffers); deskway stream bounds the process
// with a Go memory limit derived from max_buffer_mb.
func TestStreamMemoryBoundUnderChurn(t *testing.T) {
	parallel(t) // its server's own memory, on a port the kernel chose
	_, clientTLS, cert, key := testkit.TLS(t)
	r := startStreamWith(t, "on", "1m", cert, key, "open", "")
	pid := r.log.Cmd.Process.Pid
	before := rssOf(t, pid)
	const (
		conns   = 20
		inCall  = 16
		readLen = 32 << 20
		run     = 6 * time.Second
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	var raws []net.Conn
	for i := range conns {
		raw, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { raw.Close() })
		raws = append(raws, raw)
		conn, _, err := nbdclient.Handshake(raw, "golden", nbdclient.Options{TLS: clientTLS})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- churn(conn, uint64(i), inCall, readLen, stop)
		}()
	}
	var peak int64
	deadline := time.Now().Add(run)
	for time.Now().Before(deadline) {
		peak = max(peak, rssOf(t, pid))
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	for _, c := range raws {
		c.Close()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	const limit = 1536 << 20 // max_buffer_mb and the quarter more the memory limit allows, with room
	t.Logf("RSS %d MiB before, %d MiB at peak with %d connections reading %d replies of 32 MiB each at once (max_buffer_mb 1024)",
		before>>20, peak>>20, conns, inCall)
	if peak-before > limit {
		t.Fatalf("the server grew by %d MiB holding at most 1024 MiB of buffers (at most %d MiB allowed)", (peak-before)>>20, limit>>20)
	}
}

// churn keeps n READs of size in flight on conn, reading every reply,
// until stop closes.
func churn(conn net.Conn, id uint64, n int, size uint32, stop <-chan struct{}) error {
	send := func(cookie uint64) error {
		req := nbd.Request{Cmd: nbd.CmdRead, Cookie: cookie, Offset: uint64(cookie%2) << 25, Length: size}
		_, err := conn.Write(req.Append(nil))
		return err
	}
	for k := range n {
		if err := send(id<<32 | uint64(k)); err != nil {
			return err
		}
	}
	br := bufio.NewReaderSize(conn, 1<<20)
	hdr := make([]byte, 16)
	for k := n; ; k++ {
		if _, err := io.ReadFull(br, hdr); err != nil {
			select {
			case <-stop: // the test closed the connection
				return nil
			default:
				return err
			}
		}
		if binary.BigEndian.Uint32(hdr) != 0x67446698 || binary.BigEndian.Uint32(hdr[4:]) != 0 {
			return io.ErrUnexpectedEOF
		}
		if _, err := io.CopyN(io.Discard, br, int64(size)); err != nil {
			select {
			case <-stop:
				return nil
			default:
				return err
			}
		}
		if err := send(id<<32 | uint64(k)); err != nil {
			select {
			case <-stop: // the test closed the connection between a reply and the next request
				return nil
			default:
				return err
			}
		}
	}
}
