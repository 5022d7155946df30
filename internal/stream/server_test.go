package stream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
)

const testSize = 1 << 20

// writeBase writes a random base image of testSize bytes, drawn from
// seed, into dir, and returns its path and contents.
func writeBase(t testing.TB, dir string, seed int64) (string, []byte) {
	t.Helper()
	base := make([]byte, testSize)
	rand.New(rand.NewSource(seed)).Read(base)
	path := filepath.Join(dir, "base.img")
	if err := os.WriteFile(path, base, 0o400); err != nil {
		t.Fatal(err)
	}
	return path, base
}

// newTestServer serves a 1 MiB random base image on loopback.
func newTestServer(t testing.TB) (*Server, string, []byte) {
	t.Helper()
	dir := t.TempDir()
	path, base := writeBase(t, dir, 7)
	cfg := &config.Config{StateDir: dir, Stream: &config.Stream{TLS: "off", Clients: "open", CacheRAMMB: 1,
		ReconnectWindow: config.Duration(time.Minute), VDisks: []config.VDisk{{Name: "golden", Base: path}}}}
	cfg.ApplyDefaults()
	s, err := New(cfg.Stream, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		got, _ := os.ReadFile(path)
		if !bytes.Equal(got, base) {
			t.Error("base image changed")
		}
	})
	return s, ln.Addr().String(), base
}

// client is a minimal NBD client for driving the server byte by byte.
type client struct {
	t testing.TB
	c net.Conn
}

func dial(t testing.TB, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	cl := &client{t: t, c: c}
	g := cl.read(nbd.GreetingLen)
	if f, err := nbd.ParseGreeting(g); err != nil || f != nbd.FlagFixedNewstyle|nbd.FlagNoZeroes {
		t.Fatalf("greeting %x: %v", g, err)
	}
	cl.write([]byte{0, 0, 0, 3})
	return cl
}

func (cl *client) write(b []byte) {
	cl.t.Helper()
	if _, err := cl.c.Write(b); err != nil {
		cl.t.Fatalf("write: %v", err)
	}
}

func (cl *client) read(n int) []byte {
	cl.t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(cl.c, b); err != nil {
		cl.t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

// optReply reads one option reply.
func (cl *client) optReply() (nbd.OptionReplyHeader, []byte) {
	cl.t.Helper()
	h, err := nbd.ParseOptionReplyHeader(cl.read(nbd.OptionReplyHeaderLen))
	if err != nil {
		cl.t.Fatal(err)
	}
	return h, cl.read(int(h.Length))
}

// closed reports whether the server hung up.
func (cl *client) closed() bool {
	cl.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := cl.c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF)
}

// goExport negotiates NBD_OPT_GO on name with simple replies.
func (cl *client) goExport(name string) {
	cl.t.Helper()
	cl.write(nbd.AppendOption(nil, nbd.OptGo, (&nbd.InfoRequest{Name: name}).Append(nil)))
	for {
		h, data := cl.optReply()
		if h.Type == nbd.RepAck {
			return
		}
		if h.Type != nbd.RepInfo {
			cl.t.Fatalf("NBD_OPT_GO %s: reply %#x %q", name, uint32(h.Type), data)
		}
	}
}

func (cl *client) request(r nbd.Request, payload []byte) {
	cl.t.Helper()
	cl.write(append(r.Append(nil), payload...))
}

func (cl *client) simpleReply(cookie uint64) nbd.Errno {
	cl.t.Helper()
	r, err := nbd.ParseSimpleReply(cl.read(nbd.SimpleReplyLen))
	if err != nil {
		cl.t.Fatal(err)
	}
	if r.Cookie != cookie {
		cl.t.Fatalf("reply for cookie %d, want %d", r.Cookie, cookie)
	}
	return r.Error
}

func TestNegotiationErrors(t *testing.T) {
	_, addr, _ := newTestServer(t)
	t.Run("unknown option is refused and the connection goes on", func(t *testing.T) {
		cl := dial(t, addr)
		cl.write(nbd.AppendOption(nil, nbd.Option(99), []byte("xyz")))
		if h, _ := cl.optReply(); h.Type != nbd.RepErrUnsup || h.Option != 99 {
			t.Fatalf("reply %+v", h)
		}
		cl.write(nbd.AppendOption(nil, nbd.OptList, nil))
		if h, data := cl.optReply(); h.Type != nbd.RepServer || !bytes.Contains(data, []byte("golden")) {
			t.Fatalf("list: %+v %q", h, data)
		}
		if h, _ := cl.optReply(); h.Type != nbd.RepAck {
			t.Fatalf("list end: %+v", h)
		}
	})
	t.Run("bad option magic closes", func(t *testing.T) {
		cl := dial(t, addr)
		cl.write([]byte("IHAVEOPX\x00\x00\x00\x07\x00\x00\x00\x00"))
		if !cl.closed() {
			t.Fatal("connection stays open after bad magic")
		}
	})
	t.Run("request before the handshake ends closes", func(t *testing.T) {
		cl := dial(t, addr)
		cl.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: 1, Length: 512}, nil)
		if !cl.closed() {
			t.Fatal("transmission request accepted during negotiation")
		}
	})
	t.Run("unknown client flags close", func(t *testing.T) {
		c, _ := net.Dial("tcp", addr)
		defer c.Close()
		io.ReadFull(c, make([]byte, nbd.GreetingLen))
		c.Write([]byte{0, 0, 0x80, 1})
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("read after bad flags: %v", err)
		}
	})
	t.Run("huge option closes", func(t *testing.T) {
		cl := dial(t, addr)
		cl.write(nbd.AppendOption(nil, nbd.OptInfo, nil)[:12])
		cl.write([]byte{0x7f, 0, 0, 0})
		if !cl.closed() {
			t.Fatal("2 GiB option accepted")
		}
	})
	t.Run("option data over the limit is skipped", func(t *testing.T) {
		cl := dial(t, addr)
		cl.write(nbd.AppendOption(nil, nbd.OptInfo, make([]byte, maxOptionLen+1)))
		if h, _ := cl.optReply(); h.Type != nbd.RepErrTooBig {
			t.Fatalf("reply %+v", h)
		}
		cl.goExport("golden")
	})
	t.Run("unknown export", func(t *testing.T) {
		cl := dial(t, addr)
		cl.write(nbd.AppendOption(nil, nbd.OptGo, (&nbd.InfoRequest{Name: "nosuch"}).Append(nil)))
		if h, data := cl.optReply(); h.Type != nbd.RepErrUnknown || !bytes.Contains(data, []byte("nosuch")) {
			t.Fatalf("reply %+v %q", h, data)
		}
	})
	t.Run("meta context without structured replies", func(t *testing.T) {
		cl := dial(t, addr)
		req := nbd.MetaContextRequest{Name: "golden", Queries: []string{nbd.MetaContextBaseAllocation}}
		cl.write(nbd.AppendOption(nil, nbd.OptSetMetaContext, req.Append(nil)))
		if h, _ := cl.optReply(); h.Type != nbd.RepErrInvalid {
			t.Fatalf("reply %+v", h)
		}
	})
	t.Run("STARTTLS when TLS is off", func(t *testing.T) {
		cl := dial(t, addr)
		cl.write(nbd.AppendOption(nil, nbd.OptStartTLS, nil))
		if h, _ := cl.optReply(); h.Type != nbd.RepErrUnsup {
			t.Fatalf("reply %+v", h)
		}
	})
}

func TestTransmissionErrors(t *testing.T) {
	_, addr, base := newTestServer(t)
	ro := dial(t, addr)
	ro.goExport("golden")
	rw := dial(t, addr)
	rw.goExport("golden/vm1/b1")
	cases := []struct {
		name string
		cl   *client
		req  nbd.Request
		data []byte
		want nbd.Errno
	}{
		{"read past the end", ro, nbd.Request{Cmd: nbd.CmdRead, Offset: testSize - 100, Length: 200}, nil, nbd.EINVAL},
		{"read with offset overflow", ro, nbd.Request{Cmd: nbd.CmdRead, Offset: ^uint64(0) - 10, Length: 200}, nil, nbd.EINVAL},
		{"read over the maximum", ro, nbd.Request{Cmd: nbd.CmdRead, Length: maxPayload + 1}, nil, nbd.EINVAL},
		{"write to the read-only view", ro, nbd.Request{Cmd: nbd.CmdWrite, Length: 4}, []byte("abcd"), nbd.EPERM},
		{"write zeroes to the read-only view", ro, nbd.Request{Cmd: nbd.CmdWriteZeroes, Length: 4096}, nil, nbd.EPERM},
		{"write past the end", rw, nbd.Request{Cmd: nbd.CmdWrite, Offset: testSize - 2, Length: 4}, []byte("abcd"), nbd.ENOSPC},
		{"unknown command", rw, nbd.Request{Cmd: nbd.Cmd(42), Length: 0}, nil, nbd.EINVAL},
		{"block status without a meta context", rw, nbd.Request{Cmd: nbd.CmdBlockStatus, Length: 512}, nil, nbd.EINVAL},
		{"a good write", rw, nbd.Request{Cmd: nbd.CmdWrite, Offset: 10, Length: 4}, []byte("abcd"), 0},
	}
	for i, tc := range cases {
		tc.req.Cookie = uint64(100 + i)
		tc.cl.request(tc.req, tc.data)
		if got := tc.cl.simpleReply(tc.req.Cookie); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	// The connection still serves reads after every error.
	rw.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: 1, Offset: 0, Length: 64}, nil)
	if e := rw.simpleReply(1); e != 0 {
		t.Fatal(e)
	}
	want := append(append([]byte{}, base[:10]...), "abcd"...)
	want = append(want, base[14:64]...)
	if got := rw.read(64); !bytes.Equal(got, want) {
		t.Fatalf("read after write:\n got %x\nwant %x", got, want)
	}
	// A write over the maximum cannot be skipped: the server hangs up.
	rw.request(nbd.Request{Cmd: nbd.CmdWrite, Cookie: 2, Length: maxPayload + 1}, nil)
	if !rw.closed() {
		t.Fatal("oversized write did not close the connection")
	}
}

// TestDisconnectMidWrite: a client that hangs up inside a write's payload
// stores nothing of it, and other clients carry on. The large write is
// received straight into cache blocks (stagedWrite), the small one
// through a buffer.
func TestDisconnectMidWrite(t *testing.T) {
	s, addr, base := newTestServer(t)
	other := dial(t, addr)
	other.goExport("golden/vm2/b1")
	for i, w := range []struct{ off, n, sent uint32 }{{0, 8192, 4096}, {1000, 256 << 10, 200 << 10}} {
		boot := fmt.Sprintf("golden/vm1/b%d", i)
		cl := dial(t, addr)
		cl.goExport(boot)
		cl.write(reqBytes(nbd.Request{Cmd: nbd.CmdWrite, Cookie: 1, Offset: uint64(w.off), Length: w.n}))
		cl.write(bytes.Repeat([]byte{0xee}, int(w.sent)))
		cl.c.Close()
		waitBootIdle(t, s, boot)
		// The same boot, reconnected, reads the base there.
		again := dial(t, addr)
		again.goExport(boot)
		again.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: 2, Length: 512 << 10}, nil)
		if e := again.simpleReply(2); e != 0 {
			t.Fatal(e)
		}
		if got := again.read(512 << 10); !bytes.Equal(got, base[:512<<10]) {
			t.Fatalf("write %d: part of an unfinished write was stored", i)
		}
	}
	other.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: 3, Length: 16}, nil)
	if e := other.simpleReply(3); e != 0 {
		t.Fatal(e)
	}
	other.read(16)
}

// waitBootIdle waits until the server has seen every connection of the
// boot named by export end, so what they did is done.
func waitBootIdle(t *testing.T, s *Server, export string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		s.mu.Lock()
		b := s.boots[export]
		idle := b != nil && b.conns == 0
		s.mu.Unlock()
		if idle {
			return
		}
	}
	t.Fatalf("boot %s still has connections", export)
}

// TestLargeWrites writes payloads large enough to be received straight
// into the write cache, unaligned and overlapping, and reads them back;
// another boot still reads the base.
func TestLargeWrites(t *testing.T) {
	_, addr, base := newTestServer(t)
	cl := dial(t, addr)
	cl.goExport("golden/vm1/b1")
	model := bytes.Clone(base)
	rng := rand.New(rand.NewSource(5))
	for i, w := range []struct{ off, n int }{{1000, 300 << 10}, {0, 64 << 10}, {200 << 10, 512 << 10}, {4096, 128 << 10}} {
		p := make([]byte, w.n)
		rng.Read(p)
		cl.request(nbd.Request{Cmd: nbd.CmdWrite, Cookie: uint64(i), Offset: uint64(w.off), Length: uint32(w.n)}, p)
		if e := cl.simpleReply(uint64(i)); e != 0 {
			t.Fatalf("write %d: %v", i, e)
		}
		copy(model[w.off:], p)
	}
	cl.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: 9, Length: testSize}, nil)
	if e := cl.simpleReply(9); e != 0 {
		t.Fatal(e)
	}
	if !bytes.Equal(cl.read(testSize), model) {
		t.Fatal("large writes did not read back")
	}
	other := dial(t, addr)
	other.goExport("golden/vm2/b1")
	other.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: 1, Length: testSize}, nil)
	if e := other.simpleReply(1); e != 0 {
		t.Fatal(e)
	}
	if !bytes.Equal(other.read(testSize), base) {
		t.Fatal("another boot sees the writes")
	}
}

// TestStructuredReplies covers chunks, block status and error chunks.
func TestStructuredReplies(t *testing.T) {
	_, addr, base := newTestServer(t)
	cl := dial(t, addr)
	cl.write(nbd.AppendOption(nil, nbd.OptStructuredReply, nil))
	if h, _ := cl.optReply(); h.Type != nbd.RepAck {
		t.Fatal(h)
	}
	req := nbd.MetaContextRequest{Name: "golden/vm1/b1", Queries: []string{nbd.MetaContextBaseAllocation}}
	cl.write(nbd.AppendOption(nil, nbd.OptSetMetaContext, req.Append(nil)))
	if h, data := cl.optReply(); h.Type != nbd.RepMetaContext || !bytes.HasSuffix(data, []byte(nbd.MetaContextBaseAllocation)) {
		t.Fatal(h, data)
	}
	if h, _ := cl.optReply(); h.Type != nbd.RepAck {
		t.Fatal(h)
	}
	cl.goExport("golden/vm1/b1")
	chunk := func() (nbd.ChunkHeader, []byte) {
		h, err := nbd.ParseChunkHeader(cl.read(nbd.StructuredHeaderLen))
		if err != nil {
			t.Fatal(err)
		}
		return h, cl.read(int(h.Length))
	}
	cl.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: 5, Offset: 1000, Length: 100}, nil)
	h, p := chunk()
	if h.Type != nbd.ChunkOffsetData || h.Flags != nbd.ChunkFlagDone || h.Cookie != 5 || !bytes.Equal(p[8:], base[1000:1100]) {
		t.Fatalf("read chunk %+v", h)
	}
	cl.request(nbd.Request{Cmd: nbd.CmdBlockStatus, Cookie: 6, Offset: 0, Length: 65536}, nil)
	h, p = chunk()
	id, ext, err := nbd.ParseBlockStatus(p)
	if h.Type != nbd.ChunkBlockStatus || err != nil || id != baseContextID || len(ext) != 1 || ext[0].Length != 65536 {
		t.Fatalf("block status %+v %d %+v %v", h, id, ext, err)
	}
	// The test base has no holes; a written range reports data too.
	cl.request(nbd.Request{Cmd: nbd.CmdWrite, Cookie: 61, Offset: 0, Length: 3}, []byte("abc"))
	if h, _ = chunk(); h.Type != nbd.ChunkNone {
		t.Fatalf("write %+v", h)
	}
	cl.request(nbd.Request{Cmd: nbd.CmdBlockStatus, Cookie: 62, Offset: 0, Length: 8192}, nil)
	if _, p = chunk(); true {
		if _, ext, _ := nbd.ParseBlockStatus(p); len(ext) != 1 || ext[0].Flags != 0 || ext[0].Length != 8192 {
			t.Fatalf("block status over a write: %+v", ext)
		}
	}
	cl.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: 7, Offset: testSize, Length: 1}, nil)
	h, p = chunk()
	if e, msg, err := nbd.ParseErrorChunk(p); h.Type != nbd.ChunkError || err != nil || e != nbd.EINVAL || msg == "" {
		t.Fatalf("error chunk %+v %v %q %v", h, e, msg, err)
	}
	cl.request(nbd.Request{Cmd: nbd.CmdFlush, Cookie: 8}, nil)
	if h, _ = chunk(); h.Type != nbd.ChunkNone || h.Flags != nbd.ChunkFlagDone {
		t.Fatalf("flush %+v", h)
	}
}

// FuzzConn feeds arbitrary client bytes to a connection handler, both
// the one over any net.Conn and the event loop that serves plain TCP: it
// must never panic, hang, or touch the base image.
func FuzzConn(f *testing.F) {
	goGolden := nbd.AppendOption(nil, nbd.OptGo, (&nbd.InfoRequest{Name: "golden/vm/b"}).Append(nil))
	f.Add(append([]byte{0, 0, 0, 3}, nbd.AppendOption(nil, nbd.OptList, nil)...))
	f.Add(append(append([]byte{0, 0, 0, 3}, goGolden...), reqBytes(nbd.Request{Cmd: nbd.CmdWrite, Offset: 4, Length: 4})...))
	f.Add(append(append(append([]byte{0, 0, 0, 1}, nbd.AppendOption(nil, nbd.OptStructuredReply, nil)...), goGolden...),
		reqBytes(nbd.Request{Cmd: nbd.CmdRead, Length: 4096})...))
	f.Add(append(append([]byte{0, 0, 0, 3}, goGolden...), append(reqBytes(nbd.Request{Cmd: nbd.CmdWrite, Offset: 4, Length: 70000}),
		bytes.Repeat([]byte{1}, 70000)...)...))
	s, addr, base := newTestServer(f)
	basePath := s.byName["golden"].path
	f.Fuzz(func(t *testing.T, in []byte) {
		// Whatever the input did, the base is untouched and another boot
		// reads the base where the input's boot wrote.
		defer func() {
			if got, _ := os.ReadFile(basePath); !bytes.Equal(got, base) {
				t.Fatal("the input changed the base image")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			other, err := nbdclient.Dial(ctx, addr, "golden/other/b", nbdclient.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			got := make([]byte, 128<<10)
			if _, err := other.ReadAt(got, 0); err != nil || !bytes.Equal(got, base[:len(got)]) {
				t.Fatalf("another boot reads other bytes than the base (%v)", err)
			}
		}()
		a, b := net.Pipe()
		go io.Copy(io.Discard, a)
		done := make(chan struct{})
		src, _ := s.admit(b)
		go func() { s.serveConn(b, src); close(done) }()
		a.Write(in)
		a.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("handler did not return after the client closed")
		}

		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		got := make(chan error, 1)
		go func() { _, err := io.Copy(io.Discard, c); got <- err }()
		c.Write(in)
		c.(*net.TCPConn).CloseWrite()
		// A server that hangs up on bad input with bytes unread resets
		// the connection; only a timeout means it did not hang up.
		if err := <-got; err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("server did not close the TCP connection after the client's end: %v", err)
		}
	})
}

func reqBytes(r nbd.Request) []byte { return r.Append(nil) }

// TestPipelinedRequests sends a few hundred reads and writes, large and
// small, without waiting for replies, as a kernel client with a deep
// queue does, and checks every reply against a model of the disk. NBD
// lets a server answer in any order; replies are matched by cookie.
func TestPipelinedRequests(t *testing.T) {
	_, addr, base := newTestServer(t)
	cl := dial(t, addr)
	cl.goExport("golden/vm1/b1")
	model := bytes.Clone(base)
	rng := rand.New(rand.NewSource(11))
	type pending struct {
		read bool
		want []byte
	}
	sent := map[uint64]pending{}
	var stream []byte
	for i := range 300 {
		n := 1 + rng.Intn(4096)
		if rng.Intn(4) == 0 {
			n = 64<<10 + rng.Intn(200<<10)
		}
		off := rng.Intn(testSize - n)
		cookie := uint64(i)
		if rng.Intn(2) == 0 {
			p := make([]byte, n)
			rng.Read(p)
			stream = append(stream, reqBytes(nbd.Request{Cmd: nbd.CmdWrite, Cookie: cookie, Offset: uint64(off), Length: uint32(n)})...)
			stream = append(stream, p...)
			copy(model[off:], p)
			sent[cookie] = pending{}
			continue
		}
		stream = append(stream, reqBytes(nbd.Request{Cmd: nbd.CmdRead, Cookie: cookie, Offset: uint64(off), Length: uint32(n)})...)
		sent[cookie] = pending{read: true, want: bytes.Clone(model[off : off+n])}
	}
	// Replies are read while requests are still going out: neither side
	// may wait for the other's socket to drain.
	go cl.c.Write(stream)
	for range len(sent) {
		r, err := nbd.ParseSimpleReply(cl.read(nbd.SimpleReplyLen))
		if err != nil {
			t.Fatal(err)
		}
		p, ok := sent[r.Cookie]
		if !ok || r.Error != 0 {
			t.Fatalf("reply %+v: unknown cookie or error", r)
		}
		delete(sent, r.Cookie)
		if p.read && !bytes.Equal(cl.read(len(p.want)), p.want) {
			t.Fatalf("read %d does not match the writes sent before it", r.Cookie)
		}
	}
}

// TestShutdownWithFullSocket stops the server while a client that reads
// nothing has filled its socket with replies: Serve must still return.
func TestShutdownWithFullSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "base.img")
	if err := os.WriteFile(path, make([]byte, testSize), 0o400); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{StateDir: dir, Stream: &config.Stream{TLS: "off", Clients: "open", VDisks: []config.VDisk{{Name: "golden", Base: path}}}}
	cfg.ApplyDefaults()
	s, err := New(cfg.Stream, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	cl := dial(t, ln.Addr().String())
	cl.goExport("golden")
	for i := range 64 {
		cl.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: uint64(i), Length: testSize}, nil)
	}
	// Wait until the server is stuck on the full socket.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if testutil.ToFloat64(s.metrics.byCmd[nbd.CmdRead]) > 0 {
			break
		}
	}
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return with a client's socket full")
	}
}

func TestCanonicalStage(t *testing.T) {
	for in, want := range map[string]string{"": "", "production": "", "test": "test", "maintenance": "maintenance",
		"v0": "v0", "v00": "v0", "v+0": "v0", "v12": "v12", "v012": "v12", "vx": "vx"} {
		if got := canonicalStage(in); got != want {
			t.Errorf("canonicalStage(%q) = %q, want %q", in, got, want)
		}
	}
}
