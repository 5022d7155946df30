package nbdclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/proto/nbd"
	"github.com/deskway/deskway/internal/testkit"
)

// TestAgainstNBDKit checks the client against a real server, nbdkit's
// memory plugin, with simple and structured replies and many requests in
// flight at once.
func TestAgainstNBDKit(t *testing.T) {
	addr := startNBDKit(t)
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Dial(ctx, addr, "", Options{Structured: structured})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Size != 4<<20 || c.Flags&nbd.FlagHasFlags == 0 {
				t.Fatalf("size %d flags %#x", c.Size, c.Flags)
			}
			inParallel(t, 64, func(i int) error {
				p := make([]byte, 16<<10)
				rand.New(rand.NewSource(int64(i))).Read(p)
				off := int64(i) * int64(len(p))
				if err := c.WriteAt(p, off, i%2 == 0); err != nil {
					return err
				}
				got := make([]byte, len(p))
				if _, err := c.ReadAt(got, off); err != nil {
					return err
				}
				if !bytes.Equal(got, p) {
					return fmt.Errorf("block %d read back differently", i)
				}
				return nil
			})
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			// A read past the end comes back as the server's error.
			_, err = c.ReadAt(make([]byte, 512), 4<<20)
			var se *ServerError
			if !errors.As(err, &se) || se.Errno != nbd.EINVAL {
				t.Fatalf("read past end: %v", err)
			}
			// A sparse region of nbdkit memory reads as zeroes (a hole chunk
			// when structured).
			z := bytes.Repeat([]byte{1}, 64<<10)
			if _, err := c.ReadAt(z, 3<<20); err != nil || !bytes.Equal(z, make([]byte, 64<<10)) {
				t.Fatalf("hole read: %v", err)
			}
		})
	}
}

// startNBDKit serves a 4 MiB nbdkit memory disk on loopback for the
// test's lifetime and returns its address.
func startNBDKit(t *testing.T) string {
	t.Helper()
	testkit.Require(t, "nbdkit")
	port := testkit.FreePort(t)
	cmd := exec.Command("nbdkit", "-f", "-i", "127.0.0.1", "-p", fmt.Sprint(port), "--exit-with-parent", "memory", "4M")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := testkit.WaitPort(addr, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return addr
}

// inParallel runs f(0) to f(n-1) at once, as many requests in flight on
// one connection, and reports every error.
func inParallel(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
