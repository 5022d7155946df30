package stream

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/evloop"
	"github.com/deskway/deskway/internal/proto/nbd"
)

// loops are the event loops that serve plain-TCP connections in
// transmission, one fewer than the processors Go runs on (loopCount).
//
// A boot storm is a thousand connections each with a few small requests
// in flight. Served by a goroutine per connection, every request cost a
// wake-up of the reader, a hand-off to a worker and a lock around the
// reply; on an event loop a connection's requests are read, served and
// answered on the thread that learned they had arrived, and replies
// that queue up go out in one write.
type loops struct {
	all []*evloop.Loop
	wg  sync.WaitGroup
	mu  sync.Mutex
	n   int
}

func startLoops() (*loops, error) {
	ls := &loops{}
	for range loopCount(runtime.GOMAXPROCS(0)) {
		l, err := evloop.New()
		if err != nil {
			ls.close()
			return nil, fmt.Errorf("stream: %w", err)
		}
		ls.all = append(ls.all, l)
		ls.wg.Add(1)
		go func() { defer ls.wg.Done(); _ = l.Run() }()
	}
	return ls, nil
}

// loopCount is how many loops serve on procs processors: one fewer, and
// at least one. With a loop on every processor, whatever else the server
// runs (the write caches' reserving thread, the collector, the admin
// listener's metrics) took a processor from a loop: a runtime trace of a
// 1,000-client storm had the two loops on a 2-core machine runnable and
// waiting for a processor 20 % of the time, preempted in the middle of a
// batch. In storms of 500 taking turns on that machine, one loop booted
// them as fast or faster than two, with fewer slow requests
// (docs/benchmarks/stream/loops-500).
func loopCount(procs int) int { return max(1, procs-1) }

// next picks a loop, round robin.
func (ls *loops) next() *evloop.Loop {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.n++
	return ls.all[ls.n%len(ls.all)]
}

// close stops the loops; connections on them have ended already.
func (ls *loops) close() {
	for _, l := range ls.all {
		l.Close()
	}
	ls.wg.Wait()
}

// onLoop reports whether a connection in transmission can be served on
// an event loop: plain TCP (TLS records need Go's crypto/tls on a
// blocking connection), and a view whose every operation works in memory
// or the page cache. Private images and the shared store's caches sync
// to disk on FLUSH, which must not stall a loop's other clients.
func (c *conn) onLoop(exp *export) bool {
	if c.s.loops == nil || c.tls {
		return false
	}
	if _, ok := c.nc.(*net.TCPConn); !ok {
		return false
	}
	switch exp.view.(type) {
	case nil, *writeCache:
		return true
	}
	return false
}

// transmitOnLoop serves the connection on an event loop until it ends,
// returning as transmit does.
func (c *conn) transmitOnLoop(exp *export) (disc bool, err error) {
	fd, err := evloop.Dup(c.nc)
	if err != nil {
		return false, err
	}
	k := &loopConn{c: c, exp: exp, l: c.s.loops.next(), fd: fd, done: make(chan struct{}),
		in: make([]byte, connReadBuf)}
	// Requests the client sent right after negotiating are in the reader.
	k.have, _ = c.r.Read(k.in[:c.r.Buffered()])
	c.r = nil
	s := c.s
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		unix.Close(fd)
		return false, net.ErrClosed
	}
	s.onLoops[k] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.onLoops, k)
		s.mu.Unlock()
	}()
	// Go's poller lets go of the socket, as only the loop reads it now.
	// Left registered there too, every packet of every connection on a
	// loop was reported to Go's epoll as well, and the scheduler's poll
	// of the network, which runs each time a busy loop is preempted,
	// returned them by the hundred: in a storm of 1,000 boots that poll
	// took more of the server's CPU than the loops' own epoll waits.
	_ = c.nc.Close()
	if err := k.l.Post(k.begin); err != nil {
		unix.Close(fd)
		return false, err
	}
	<-k.done
	return k.disc, k.err
}

// Limits of one connection on a loop.
const (
	// outLimit is how many bytes of replies gather before they are
	// written: replies to requests that arrived together go out together.
	outLimit = 32 << 10
	// readyBudget is how many steps one connection takes before the
	// loop's other connections get their turn.
	readyBudget = 64
)

// loopConn is one connection in transmission, a state machine run by its
// loop. Requests are served one at a time in the order they arrive: a
// READ's reply (header, then its data from the base file by sendfile or
// from a buffer) goes out before the next request is looked at, and a
// WRITE's payload is received (straight into cache blocks when large)
// before it is applied and answered. A client that keeps the socket full
// waits on its own socket, not on other clients.
type loopConn struct {
	c    *conn
	exp  *export
	l    *evloop.Loop
	fd   int
	done chan struct{} // closed when the connection has ended
	disc bool          // it ended with NBD_CMD_DISC
	err  error         // why it ended otherwise, if not a hang-up

	in         []byte // received bytes; in[next:have] not parsed yet
	next, have int

	out      []byte // replies not yet sent
	data     []byte // a READ's data, from the pool, sent after out
	dataSent int
	dataRest nbd.Request // what of a large READ is still to be read into data
	file     int         // or a READ's data in this file, sent after out
	fileOff  int64
	fileLeft int

	wreq    nbd.Request  // a WRITE whose payload is arriving
	wparts  [][]byte     // where its payload goes, in order
	wbuf    []byte       // a buffer from the pool, or
	wstaged *stagedWrite // blocks of the cache
	recv    bool

	closed bool
}

func (k *loopConn) begin() {
	if k.closed {
		// Ended by a shutdown before it began: its descriptor is closed.
		return
	}
	if err := k.l.Add(k.fd, k); err != nil {
		k.end(err)
		return
	}
	k.Ready(evloop.Readable | evloop.Writable)
}

// Ready does all it can until the socket would block either way (the
// edge that unblocks it calls it again) or its budget is spent.
func (k *loopConn) Ready(uint32) {
	for step := 0; !k.closed; step++ {
		if step == readyBudget {
			k.flush()
			k.l.Again(k)
			return
		}
		switch {
		case len(k.out) >= outLimit || k.data != nil || k.fileLeft > 0:
			if !k.send() {
				return
			}
		case k.recv:
			if !k.receive() {
				k.flush()
				return
			}
		case k.have-k.next >= nbd.RequestLen:
			k.handle()
		default:
			if !k.fill() {
				k.flush()
				return
			}
		}
	}
}

// send writes the queued replies and a READ's data; false when the
// socket is full.
func (k *loopConn) send() bool {
	if len(k.out) > 0 {
		// A header goes in one segment with the start of its data.
		write := evloop.Write
		if k.data != nil || k.fileLeft > 0 {
			write = evloop.WriteMore
		}
		n, err := write(k.fd, k.out)
		if err != nil {
			k.end(err)
			return false
		}
		k.out = k.out[:copy(k.out, k.out[n:])]
		if len(k.out) > 0 {
			return false
		}
	}
	switch {
	case k.data != nil:
		n, err := evloop.Write(k.fd, k.data[k.dataSent:])
		if err != nil {
			k.end(err)
			return false
		}
		if k.dataSent += n; k.dataSent < len(k.data) {
			return false
		}
		if k.dataRest.Length > 0 {
			return k.nextChunk()
		}
		k.putData()
	case k.fileLeft > 0:
		n, err := evloop.Sendfile(k.fd, k.file, k.fileOff, k.fileLeft)
		if err != nil {
			k.end(err)
			return false
		}
		k.fileOff += int64(n)
		k.fileLeft -= n
		// A short send without EAGAIN raises no edge: only a full
		// socket (nothing sent) waits for one.
		return n > 0
	}
	return true
}

// flush writes what the socket takes of the queued replies; the rest
// waits for the next Ready.
func (k *loopConn) flush() {
	if len(k.out) == 0 || k.closed || k.data != nil || k.fileLeft > 0 {
		return
	}
	n, err := evloop.Write(k.fd, k.out)
	if err != nil {
		k.end(err)
		return
	}
	k.out = k.out[:copy(k.out, k.out[n:])]
}

// fill reads more request bytes; false when there are none now.
func (k *loopConn) fill() bool {
	if k.next > 0 {
		k.have = copy(k.in, k.in[k.next:k.have])
		k.next = 0
	}
	n, err := evloop.Read(k.fd, k.in[k.have:])
	switch {
	case err != nil:
		k.end(err)
		return false
	case n == 0:
		k.end(nil)
		return false
	case n < 0:
		return false
	}
	k.have += n
	return true
}

// handle serves the request at the front of the input.
func (k *loopConn) handle() {
	c, exp := k.c, k.exp
	var req nbd.Request
	if err := req.Decode(k.in[k.next : k.next+nbd.RequestLen]); err != nil {
		k.end(err)
		return
	}
	k.next += nbd.RequestLen
	switch req.Cmd {
	case nbd.CmdDisc:
		k.disc = true
		k.flush()
		k.end(nil)
		return
	case nbd.CmdWrite:
		if req.Length == 0 {
			// Nothing to receive: waiting for payload bytes would read the
			// next request, or take a quiet socket for a hang-up.
			c.count(exp, req)
			k.out = c.execute(k.out, exp, req, nil, nil)
			return
		}
		if req.Length > maxPayload {
			// The payload cannot be skipped safely at this size.
			k.end(fmt.Errorf("NBD_CMD_WRITE of %d bytes over the %d-byte maximum", req.Length, maxPayload))
			return
		}
		k.wreq, k.recv = req, true
		if k.wstaged = stageWrite(exp, req); k.wstaged != nil {
			k.wparts = k.wstaged.parts
		} else {
			k.wbuf = c.s.bufs.get(int(req.Length))
			k.wparts = append(k.wparts[:0], k.wbuf)
		}
		return
	}
	c.count(exp, req)
	if req.Cmd != nbd.CmdRead {
		k.out = c.execute(k.out, exp, req, nil, nil)
		return
	}
	if r := c.checkRead(exp, req); r != nil {
		k.out = append(k.out, r...)
		return
	}
	if baseRange(exp, req) {
		c.s.metrics.readBytes.Add(float64(req.Length))
		k.out = c.dataHeader(k.out, req, int(req.Length))
		k.file, k.fileOff, k.fileLeft = exp.img.baseFD, int64(req.Offset), int(req.Length)
		return
	}
	// A large read from the view goes out a chunk at a time through one
	// buffer, so a client that asks for 32 MiB and reads nothing makes
	// its connection hold one chunk, not the whole reply.
	first := req
	first.Length = min(req.Length, loopChunk)
	buf := c.s.bufs.get(int(first.Length))
	if r := c.readView(exp, first, buf); r != nil {
		c.s.bufs.put(buf)
		k.out = append(k.out, r...)
		return
	}
	k.out = c.dataHeader(k.out, req, int(req.Length))
	if len(buf) == 0 {
		c.s.bufs.put(buf)
		return
	}
	k.data = buf
	k.dataRest = req
	k.dataRest.Offset += uint64(first.Length)
	k.dataRest.Length -= first.Length
}

// loopChunk is the most of a READ's data a connection on a loop holds.
const loopChunk = 1 << 20

// nextChunk reads the next part of a chunked READ into data; false when
// it could not, which ends the connection (its reply is half sent).
func (k *loopConn) nextChunk() bool {
	piece := k.dataRest
	piece.Length = min(piece.Length, uint32(cap(k.data)))
	k.data = k.data[:piece.Length]
	if r := k.c.readView(k.exp, piece, k.data); r != nil {
		k.end(fmt.Errorf("read of %d bytes at %d failed in the middle of a reply", piece.Length, piece.Offset))
		return false
	}
	k.dataSent = 0
	k.dataRest.Offset += uint64(piece.Length)
	k.dataRest.Length -= piece.Length
	return true
}

// receive moves a WRITE's payload into place, from the input buffer
// first and then straight from the socket; once all of it is there the
// write is applied and answered. False when the socket has no more now.
func (k *loopConn) receive() bool {
	for len(k.wparts) > 0 {
		p := k.wparts[0]
		var n int
		if buffered := k.have - k.next; buffered > 0 {
			n = copy(p, k.in[k.next:k.have])
			k.next += n
		} else {
			var err error
			n, err = evloop.Read(k.fd, p)
			switch {
			case err != nil:
				k.end(err)
				return false
			case n == 0:
				// A client that hangs up mid-write: nothing of it is stored.
				k.end(nil)
				return false
			case n < 0:
				return false
			}
		}
		if n == len(p) {
			k.wparts = k.wparts[1:]
		} else {
			k.wparts[0] = p[n:]
		}
	}
	c, req := k.c, k.wreq
	c.count(k.exp, req)
	k.out = c.execute(k.out, k.exp, req, k.wbuf, k.wstaged)
	k.recv, k.wstaged = false, nil
	if k.wbuf != nil {
		c.s.bufs.put(k.wbuf)
		k.wbuf = nil
	}
	return true
}

func (k *loopConn) putData() {
	if k.data != nil {
		k.c.s.bufs.put(k.data)
		k.data, k.dataSent = nil, 0
		k.dataRest = nbd.Request{}
	}
}

// end closes the connection, giving back what an unfinished request
// holds, and lets transmitOnLoop return; err is why, nil for a hang-up
// or NBD_CMD_DISC.
func (k *loopConn) end(err error) {
	if k.closed {
		return
	}
	k.closed = true
	k.err = err
	if errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE) {
		k.err = nil
	}
	k.l.Remove(k.fd)
	unix.Close(k.fd)
	if k.wstaged != nil {
		k.wstaged.abort()
		k.wstaged = nil
	}
	if k.wbuf != nil {
		k.c.s.bufs.put(k.wbuf)
		k.wbuf = nil
	}
	k.putData()
	close(k.done)
}
