package gateway

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// fullListener listens on loopback with a listen queue of one and fills
// it, as a busy xrdp's queue of two is full: the next SYN is dropped.
// accept drains the queue, and every connection after, from then on.
func fullListener(t *testing.T) (addr string, accept func()) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	addr = ln.Addr().String()
	// Connections that fill the queue; none is accepted until accept.
	for range 2 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	return addr, func() {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
			}
		}()
	}
}

// TestDialDoesNotWaitForTheSYNRetransmission: a dial whose SYN a full
// listen queue dropped connects soon after the host makes room, not at
// the kernel's retransmission 1 s later. The plain dialer's time to the
// same kind of host shows the drop happened.
func TestDialDoesNotWaitForTheSYNRetransmission(t *testing.T) {
	nd := &net.Dialer{Timeout: 10 * time.Second}
	timeDial := func(dial func(context.Context, string, string) (net.Conn, error)) time.Duration {
		addr, accept := fullListener(t)
		time.AfterFunc(100*time.Millisecond, accept)
		start := time.Now()
		c, err := dial(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		return time.Since(start)
	}
	if plain := timeDial(nd.DialContext); plain < 900*time.Millisecond {
		t.Fatalf("the plain dial took %v: the full queue dropped no SYN, so this test shows nothing", plain)
	}
	sd := staggeredDialer{d: nd, stagger: hostDialStagger, attempts: hostDialAttempts}
	if got := timeDial(sd.DialContext); got >= 900*time.Millisecond {
		t.Errorf("the staggered dial took %v, as long as the kernel's SYN retransmission", got)
	}
}

// TestDialRefusedAnswersAtOnce: a host that refuses is not asked again.
func TestDialRefusedAnswersAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	sd := staggeredDialer{d: &net.Dialer{Timeout: 10 * time.Second}, stagger: 50 * time.Millisecond, attempts: hostDialAttempts}
	start := time.Now()
	if _, err := sd.DialContext(context.Background(), "tcp", addr); err == nil {
		t.Fatal("a closed port connected")
	} else if took := time.Since(start); took > time.Second {
		t.Errorf("refused after %v", took)
	}
}
