package pollread

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestPumpPingPong is the interactive case the package exists for: one
// small message at a time, each answered before the next is sent. A lost
// readiness edge would hang it.
func TestPumpPingPong(t *testing.T) {
	for _, name := range []string{"tcp", "pipe"} {
		t.Run(name, func(t *testing.T) {
			var a, b net.Conn
			if name == "tcp" {
				a, b = tcpPair(t)
			} else {
				a, b = net.Pipe()
				t.Cleanup(func() { a.Close(); b.Close() })
			}
			done := make(chan error, 1)
			go func() {
				done <- Pump(b, make([]byte, 16), func(p []byte) ([]byte, error) {
					_, err := b.Write(bytes.ToUpper(p))
					return make([]byte, 16), err
				})
			}()
			a.SetDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, 3)
			for i := 0; i < 2000; i++ {
				if _, err := a.Write([]byte("abc")); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(a, got); err != nil {
					t.Fatalf("round trip %d: %v", i, err)
				}
				if string(got) != "ABC" {
					t.Fatalf("round trip %d: got %q", i, got)
				}
			}
			a.Close()
			if err := <-done; !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
				t.Fatalf("Pump after peer close: %v, want EOF", err)
			}
		})
	}
}

// TestPumpBulkAndGrow sends more than one buffer at once and lets the
// callback grow the buffer; every byte must arrive once, in order.
func TestPumpBulkAndGrow(t *testing.T) {
	a, b := tcpPair(t)
	want := make([]byte, 4<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() {
		a.Write(want)
		a.Close()
	}()
	var got []byte
	sizes := map[int]bool{}
	err := Pump(b, make([]byte, 512), func(p []byte) ([]byte, error) {
		got = append(got, p...)
		sizes[cap(p)] = true
		if len(p) == cap(p) && cap(p) < 64<<10 {
			return make([]byte, 4*cap(p)), nil
		}
		return p[:cap(p)], nil
	})
	if !errors.Is(err, io.EOF) {
		t.Fatalf("Pump: %v, want EOF", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d, equal prefix %v", len(got), len(want), bytes.Equal(got, want[:min(len(got), len(want))]))
	}
	if len(sizes) < 2 {
		t.Errorf("buffer never grew: %v", sizes)
	}
}

// TestPumpStopsOnCallbackError returns the callback's error as is.
func TestPumpStopsOnCallbackError(t *testing.T) {
	a, b := tcpPair(t)
	boom := errors.New("boom")
	a.Write([]byte("x"))
	err := Pump(b, make([]byte, 8), func([]byte) ([]byte, error) { return nil, boom })
	if err != boom {
		t.Fatalf("Pump: %v, want boom", err)
	}
}

// TestPumpClose: closing the connection from another goroutine ends a
// Pump that is waiting for data.
func TestPumpClose(t *testing.T) {
	_, b := tcpPair(t)
	done := make(chan error, 1)
	go func() { done <- Pump(b, make([]byte, 8), func(p []byte) ([]byte, error) { return p, nil }) }()
	time.Sleep(50 * time.Millisecond)
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Pump after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Pump did not return after Close")
	}
}
