package proxylisten

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// failOnce is a listener whose first Accept fails as a process out of
// file descriptors sees it.
type failOnce struct {
	net.Listener
	failed atomic.Bool
}

func (f *failOnce) Accept() (net.Conn, error) {
	if !f.failed.Swap(true) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return f.Listener.Accept()
}

// TestKeepsAcceptingAfterATemporaryError: running out of file
// descriptors once must not stop the server accepting for good.
func TestKeepsAcceptingAfterATemporaryError(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := New(&failOnce{Listener: inner}, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			got <- c
		}
	}()
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case s := <-got:
		s.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("after one EMFILE, the listener accepted nothing more")
	}
}

// TestCloseEndsAccept: Accept returns once the listener is closed.
func TestCloseEndsAccept(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := New(inner, nil, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	errc := make(chan error, 1)
	go func() { _, err := ln.Accept(); errc <- err }()
	time.Sleep(50 * time.Millisecond)
	ln.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Accept returned a connection after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return after Close")
	}
}
