package load

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/echo"
)

func TestGeneratorAgainstEcho(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go (&echo.Server{}).Serve(ctx, ln, nil)
	addr := ln.Addr().String()
	g := New(NetDialer(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}), Pattern{Up: 25, Down: 1669, Count: 2, Interval: 20 * time.Millisecond})
	defer g.Close()
	if err := g.Grow(ctx, 20, 5); err != nil {
		t.Fatal(err)
	}
	st, err := g.Measure(ctx, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// 20 tunnels at 50/s for 0.5 s: at most about 500 round trips (the
	// pattern's pace is an upper bound; a busy machine may manage fewer),
	// every one answered.
	if st.Tunnels != 20 || st.RoundTrips <= 0 || st.RoundTrips > 700 || st.Missing != 0 || st.P50ms <= 0 || st.P99ms < st.P50ms {
		t.Fatalf("stats %+v", st)
	}
	if g.Errors() != 0 {
		t.Fatalf("%d errors", g.Errors())
	}
	// A second window counts only its own samples.
	st2, _ := g.Measure(ctx, 200*time.Millisecond)
	if st2.RoundTrips > 300 {
		t.Fatalf("second window kept old samples: %+v", st2)
	}
}

func TestHello(t *testing.T) {
	h := echo.Hello{Mode: echo.ModeEcho, Count: 1, Up: 90, Down: 90}
	got, err := echo.ParseHello(h.Append(nil))
	if err != nil || got != h {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := echo.ParseHello([]byte("XX\x01\x01\x00\x00\x00\x00")); err == nil {
		t.Fatal("bad magic accepted")
	}
}

// TestGeneratorCatchesACorruptRelay: a relay that changes one byte of an
// answer is an error, not a faster round trip.
func TestGeneratorCatchesACorruptRelay(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go (&echo.Server{}).Serve(ctx, ln, nil)
	echoAddr := ln.Addr().String()
	relay, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	go func() {
		for {
			c, err := relay.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", echoAddr)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(up, c) }()
			go func() {
				buf := make([]byte, 64<<10)
				for n := 0; ; n++ {
					k, err := up.Read(buf)
					if k > 0 && n == 3 {
						buf[k/2] ^= 0x01 // the fourth read is damaged
					}
					if _, werr := c.Write(buf[:k]); werr != nil || err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	g := New(NetDialer(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", relay.Addr().String())
	}), Pattern{Up: 25, Down: 1669, Count: 2, Interval: 10 * time.Millisecond})
	defer g.Close()
	if err := g.Grow(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for g.Corrupt() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a damaged answer was not noticed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if g.Errors() == 0 {
		t.Fatal("a damaged answer was not counted as an error")
	}
}
