package evloop

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func startLoop(t *testing.T) *Loop {
	t.Helper()
	l, err := New()
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- l.Run() }()
	t.Cleanup(func() {
		l.Close()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return l
}

// socketPair returns two connected non-blocking stream sockets.
func socketPair(t *testing.T) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

// on runs f on the loop and waits for it.
func on(t *testing.T, l *Loop, f func()) {
	t.Helper()
	done := make(chan struct{})
	if err := l.Post(func() { f(); close(done) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("posted function did not run")
	}
}

// recorder reads everything its descriptor offers on each event, as a
// relay would, and passes it on.
type recorder struct {
	fd  int
	got chan []byte
}

func (r *recorder) Ready(ev uint32) {
	if ev&Readable == 0 {
		return
	}
	buf := make([]byte, 4)
	for {
		n, err := Read(r.fd, buf)
		if err != nil || n <= 0 {
			return
		}
		r.got <- bytes.Clone(buf[:n])
	}
}

func TestEventsReachTheHandler(t *testing.T) {
	l := startLoop(t)
	a, b := socketPair(t)
	r := &recorder{fd: a, got: make(chan []byte, 16)}
	on(t, l, func() {
		if err := l.Add(a, r); err != nil {
			t.Error(err)
		}
	})
	// Each write after the socket was drained must raise a new edge.
	for _, msg := range []string{"hello", "again", "x"} {
		if n, err := Write(b, []byte(msg)); err != nil || n != len(msg) {
			t.Fatalf("write: %d %v", n, err)
		}
		var got []byte
		for len(got) < len(msg) {
			select {
			case p := <-r.got:
				got = append(got, p...)
			case <-time.After(5 * time.Second):
				t.Fatalf("handler saw %q of %q", got, msg)
			}
		}
		if string(got) != msg {
			t.Fatalf("got %q, want %q", got, msg)
		}
	}
	on(t, l, func() { l.Remove(a) })
	if _, err := Write(b, []byte("late")); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-r.got:
		t.Fatalf("a removed descriptor still reached its handler: %q", p)
	case <-time.After(100 * time.Millisecond):
	}
}

// counter counts its calls and asks to run again until it reaches n.
type counter struct {
	l    *Loop
	n    int
	done chan struct{}
}

func (c *counter) Ready(uint32) {
	c.n--
	if c.n == 0 {
		close(c.done)
		return
	}
	c.l.Again(c)
}

func TestAgainRunsWithoutAnEvent(t *testing.T) {
	l := startLoop(t)
	c := &counter{l: l, n: 1000, done: make(chan struct{})}
	on(t, l, func() { l.Again(c) })
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("Again stopped with %d calls left", c.n)
	}
}

func TestPostFromManyGoroutines(t *testing.T) {
	l := startLoop(t)
	const n = 2000
	var mu sync.Mutex
	seen := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n / 8 {
				if err := l.Post(func() { mu.Lock(); seen++; mu.Unlock() }); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	on(t, l, func() {})
	mu.Lock()
	defer mu.Unlock()
	if seen != n {
		t.Fatalf("%d of %d posted functions ran", seen, n)
	}
}

func TestCloseRunsWhatWasPosted(t *testing.T) {
	l, err := New()
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{})
	if err := l.Post(func() { close(ran) }); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- l.Run() }()
	l.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	default:
		t.Fatal("a function posted before Close did not run")
	}
	if err := l.Post(func() {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Post after Close: %v, want ErrClosed", err)
	}
	l.Close() // a second Close returns too
}

func TestReadWrite(t *testing.T) {
	a, b := socketPair(t)
	buf := make([]byte, 8)
	if n, err := Read(a, buf); n != -1 || err != nil {
		t.Fatalf("read of an empty socket: %d %v, want -1 nil", n, err)
	}
	// Fill b's send buffer: Write reports what was taken, never blocks.
	big := make([]byte, 8<<20)
	n, err := Write(b, big)
	if err != nil || n <= 0 || n >= len(big) {
		t.Fatalf("write into a full socket: %d %v, want a short count", n, err)
	}
	if n, err := Write(b, big); n != 0 || err != nil {
		t.Fatalf("write into a full socket: %d %v, want 0 nil", n, err)
	}
	if err := unix.Shutdown(b, unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	total := 0
	for {
		k, err := Read(a, big)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			break
		}
		if k > 0 {
			total += k
		}
	}
	if total != n {
		t.Fatalf("read %d bytes, %d were written", total, n)
	}
	if _, err := Read(-1, buf); !errors.Is(err, unix.EBADF) {
		t.Fatalf("read of a bad descriptor: %v", err)
	}
}

// TestWritev: pieces go out in order, more than one call's worth of
// them, and a full socket stops the count short where it stopped taking
// bytes, so the caller resumes at exactly that byte.
func TestWritev(t *testing.T) {
	a, b := socketPair(t)
	var want []byte
	var iov [][]byte
	for i := range 3 * maxIOV {
		p := bytes.Repeat([]byte{byte(i)}, 1+i*997%65536)
		if i%7 == 0 {
			p = nil // empty pieces are skipped
		}
		iov = append(iov, p)
		want = append(want, p...)
	}
	got := make([]byte, 0, len(want))
	buf := make([]byte, 1<<20)
	for len(iov) > 0 {
		n, err := Writev(b, iov)
		if err != nil {
			t.Fatal(err)
		}
		for len(iov) > 0 && n >= len(iov[0]) {
			n -= len(iov[0])
			iov = iov[1:]
		}
		if len(iov) > 0 {
			iov[0] = iov[0][n:]
		}
		// Drain what the socket holds before writing on.
		for {
			k, err := Read(a, buf)
			if err != nil {
				t.Fatal(err)
			}
			if k <= 0 {
				break
			}
			got = append(got, buf[:k]...)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes that differ from the %d written", len(got), len(want))
	}
}

// BenchmarkLoopbackSmall is the kernel's floor under a relay: one 90-byte
// Write to a loopback TCP socket and the Read of it at the other end, on
// one thread, so no wakeup or scheduling is counted. A relayed round trip
// makes two of each.
func BenchmarkLoopbackSmall(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	fd := func(conn net.Conn) int {
		f, err := conn.(*net.TCPConn).File() // a blocking duplicate of the descriptor
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	w, r := fd(c), fd(s)
	msg, buf := make([]byte, 90), make([]byte, 4096)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if n, err := Write(w, msg); n != len(msg) || err != nil {
			b.Fatal(n, err)
		}
		if n, err := Read(r, buf); n != len(msg) || err != nil {
			b.Fatal(n, err)
		}
	}
}

// TestSendAll: one batch writes to many sockets, each send reports what
// its socket took (all of a small send, a short count into a nearly full
// buffer, 0 into a full one) and a send to a socket whose peer is gone
// fails with EPIPE instead of killing the process with SIGPIPE; the same
// through io_uring and, with the ring taken away, one write at a time.
func TestSendAll(t *testing.T) {
	for _, withRing := range []bool{true, false} {
		t.Run(map[bool]string{true: "io_uring", false: "writes"}[withRing], func(t *testing.T) {
			l, err := New()
			if err != nil {
				t.Fatal(err)
			}
			defer l.closeFDs()
			if withRing && l.ring == nil {
				if _, err := newRing(8); err != nil {
					t.Skipf("no io_uring here: %v", err)
				}
				t.Fatal("io_uring works here, but the loop has no ring")
			}
			if !withRing && l.ring != nil {
				l.ring.close()
				l.ring = nil
			}
			const n = 40
			var sends []Send
			var peers []int
			for i := range n {
				a, b := socketPair(t)
				sends = append(sends, Send{FD: a, P: bytes.Repeat([]byte{byte(i)}, 90+i)})
				peers = append(peers, b)
			}
			// A full socket, one with less room than its send, and one
			// whose peer has closed.
			full, _ := socketPair(t)
			for {
				if k, err := Write(full, make([]byte, 1<<16)); err != nil || k == 0 {
					break
				}
			}
			sends = append(sends, Send{FD: full, P: make([]byte, 100)})
			part, _ := socketPair(t)
			sends = append(sends, Send{FD: part, P: make([]byte, 8<<20)})
			gone, gonePeer := socketPair(t)
			unix.Close(gonePeer)
			sends = append(sends, Send{FD: gone, P: []byte("x")})

			l.SendAll(sends)
			buf := make([]byte, 4096)
			for i := range n {
				if s := sends[i]; s.N != len(s.P) || s.Err != nil {
					t.Fatalf("send %d: %d %v, want %d nil", i, s.N, s.Err, len(s.P))
				}
				k, err := Read(peers[i], buf)
				if err != nil || !bytes.Equal(buf[:max(k, 0)], sends[i].P) {
					t.Fatalf("socket %d got %d bytes (%v), want its %d", i, k, err, len(sends[i].P))
				}
			}
			if s := sends[n]; s.N != 0 || s.Err != nil {
				t.Fatalf("send into a full socket: %d %v, want 0 nil", s.N, s.Err)
			}
			if s := sends[n+1]; s.N <= 0 || s.N >= len(s.P) || s.Err != nil {
				t.Fatalf("send into a nearly full socket: %d %v, want a short count", s.N, s.Err)
			}
			if s := sends[n+2]; !errors.Is(s.Err, unix.EPIPE) {
				t.Fatalf("send to a socket whose peer closed: %d %v, want EPIPE", s.N, s.Err)
			}
			if withRing && l.ring == nil {
				t.Fatal("the ring was given up")
			}
		})
	}
}
