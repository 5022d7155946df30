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

// TestBareTLSFromATrustedAddress: with NewAllowingBareTLS, a connection
// from a trusted address that starts with a TLS handshake record is
// passed on marked bare, its first byte still unread; one that starts
// with anything else still needs a header and is closed without. New
// closes the bare one too.
func TestBareTLSFromATrustedAddress(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	accept := func(t *testing.T, ln net.Listener, first []byte) (net.Conn, error) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(first); err != nil {
			t.Fatal(err)
		}
		got := make(chan net.Conn, 1)
		go func() {
			if s, err := ln.Accept(); err == nil {
				got <- s
			}
		}()
		select {
		case s := <-got:
			return s, nil
		case <-time.After(time.Second):
			// Closed by the listener: the client sees the end.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatal("the connection was neither passed on nor closed")
			}
			return nil, io.EOF
		}
	}
	listen := func(t *testing.T, allow bool) net.Listener {
		inner, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		newLn := New
		if allow {
			newLn = NewAllowingBareTLS
		}
		ln := newLn(inner, trusted, 5*time.Second, quiet)
		t.Cleanup(func() { ln.Close() })
		return ln
	}

	// A record header and more: enough for New to read a header's worth.
	hello := append([]byte{22, 3, 1, 0, 200}, make([]byte, 20)...)
	ln := listen(t, true)
	s, err := accept(t, ln, hello)
	if err != nil {
		t.Fatal("a bare TLS connection from a trusted address was closed")
	}
	if !IsBare(s) {
		t.Fatal("the bare TLS connection was not marked bare")
	}
	b := make([]byte, 3)
	if _, err := io.ReadFull(s, b); err != nil || b[0] != 22 {
		t.Fatalf("the bare connection's first bytes: %v %v, want them unread", b, err)
	}
	s.Close()
	if s, err := accept(t, ln, []byte("GET / HTTP/1.1\r\n\r\n")); err == nil {
		s.Close()
		t.Fatal("a trusted connection with neither a header nor TLS was passed on")
	}
	if s, err := accept(t, listen(t, false), hello); err == nil {
		s.Close()
		t.Fatal("New passed on a bare TLS connection from a trusted address")
	}
}
