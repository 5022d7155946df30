package bootstorm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/evloop"
	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
)

// A fleet runs the bench's clients from a few event loops, one per core,
// each serving its share of the connections: a client is a state machine
// on a socket, not goroutines. The clients share the two cores with the
// server they measure, and with a goroutine per request and one reading
// each connection they took about half of the box in a storm of 1,000
// (stack growth, channel hand-offs and wake-ups for every reply); what
// they take is the server's no longer.
//
// A client speaks NBD's simple replies, as the Linux kernel's client
// does: one 16-byte header, then a read's data.
type fleet struct {
	loops []*fleetLoop
	// discard has reads' data dropped in the kernel (recv with MSG_TRUNC)
	// instead of copied out.
	discard bool
	// check, when set, is shown each read's data as it arrives (copying
	// clients only), at its offset on the disk: tests verify it.
	check func(off int64, p []byte) error
	fill  []byte // WRITE payloads
}

// fleetLoop is one event loop and what its clients share.
type fleetLoop struct {
	*evloop.Loop
	f       *fleet
	scratch []byte // copying clients read into it
	zero    []byte // zeroes written as data, for servers without WRITE_ZEROES; grown as asked
	tick    *ticker
	clients []*replayer // started and not yet finished
}

// newFleet starts one loop per processor; close stops them.
func newFleet(discard bool, maxLen uint32) (*fleet, error) {
	f := &fleet{discard: discard, fill: make([]byte, maxLen)}
	// Written data is random so that no server can store it as zeroes.
	rand.New(rand.NewSource(2)).Read(f.fill)
	for range runtime.GOMAXPROCS(0) {
		l, err := evloop.New()
		if err != nil {
			f.close()
			return nil, err
		}
		fl := &fleetLoop{Loop: l, f: f, scratch: make([]byte, 256<<10)}
		f.loops = append(f.loops, fl)
		go func() { _ = l.Run() }()
		res := make(chan error, 1)
		if err := l.Post(func() { res <- fl.startTicker() }); err != nil {
			res <- err
		}
		if err := <-res; err != nil {
			f.close()
			return nil, err
		}
	}
	return f, nil
}

func (f *fleet) close() {
	for _, l := range f.loops {
		l.Close()
		if l.tick != nil {
			unix.Close(l.tick.fd)
		}
	}
}

// tickEvery is how often a loop looks for requests whose time has come.
// A request goes out up to this late after its trace time, which only
// paces the boot; its latency is counted from when it is sent.
const tickEvery = time.Millisecond

// ticker is a loop's timerfd.
type ticker struct {
	l  *fleetLoop
	fd int
}

func (l *fleetLoop) startTicker() error {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("bench: timerfd_create: %w", err)
	}
	ts := unix.NsecToTimespec(int64(tickEvery))
	if err := unix.TimerfdSettime(fd, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bench: timerfd_settime: %w", err)
	}
	l.tick = &ticker{l: l, fd: fd}
	if err := l.Add(fd, l.tick); err != nil {
		unix.Close(fd)
		l.tick = nil
		return err
	}
	return nil
}

// Ready sends the requests that have come due on every client of the
// loop, and drops the finished ones.
func (t *ticker) Ready(uint32) {
	var b [8]byte
	_, _ = evloop.Read(t.fd, b[:])
	now := time.Now()
	live := t.l.clients[:0]
	for _, c := range t.l.clients {
		if c.finished {
			continue
		}
		c.pump(now)
		if !c.finished {
			live = append(live, c)
		}
	}
	clear(t.l.clients[len(live):])
	t.l.clients = live
}

// job is what one client does.
type job struct {
	addr, export string
	ops          []op
	depth        int           // requests in flight at most
	scale        float64       // multiplies each op's time; 0: no pacing
	cycle        bool          // start over at the end (the read test)
	runFor       time.Duration // with cycle: stop sending this long after connecting
	latencies    bool          // keep every request's latency
}

// run starts one client per job at once and returns their results when
// all have finished or ctx ends.
func (f *fleet) run(ctx context.Context, jobs []job) []clientResult {
	results := make([]clientResult, len(jobs))
	var wg sync.WaitGroup
	var mu sync.Mutex
	live := map[*replayer]bool{}
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			start := time.Now()
			fd, ex, err := openExport(ctx, j.addr, j.export)
			if err != nil {
				results[i] = clientResult{err: err}
				wg.Done()
				return
			}
			l := f.loops[i%len(f.loops)]
			c := &replayer{l: l, job: j, fd: fd, flags: ex.Flags, start: start,
				slots: make([]slot, j.depth), free: make([]int, 0, j.depth)}
			for s := j.depth - 1; s >= 0; s-- {
				c.free = append(c.free, s)
			}
			if j.latencies {
				c.res.lat = make([]float64, len(j.ops))
			}
			c.onDone = func() {
				c.res.took = time.Since(start)
				results[i] = c.res
				mu.Lock()
				delete(live, c)
				mu.Unlock()
				wg.Done()
			}
			mu.Lock()
			live[c] = true
			mu.Unlock()
			if err := l.Post(c.begin); err != nil {
				unix.Close(fd)
				c.res.err = err
				c.onDone()
			}
		}()
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		for c := range live {
			_ = c.l.Post(func() { c.finish(ctx.Err()) })
		}
		mu.Unlock()
		<-all
	}
	return results
}

// openExport connects and negotiates, retrying while the server's accept
// queue overflows in a storm, as a booting client's firmware would, and
// returns the socket for a loop.
func openExport(ctx context.Context, addr, export string) (int, nbdclient.Export, error) {
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		var fd int
		var ex nbdclient.Export
		fd, ex, err = handshake(ctx, addr, export)
		if err == nil {
			return fd, ex, nil
		}
		var oe *nbdclient.OptionError
		if errors.As(err, &oe) || ctx.Err() != nil {
			return -1, ex, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return -1, nbdclient.Export{}, err
}

func handshake(ctx context.Context, addr, export string) (int, nbdclient.Export, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(cctx, "tcp", addr)
	if err != nil {
		return -1, nbdclient.Export{}, err
	}
	defer conn.Close()
	dl, _ := cctx.Deadline()
	_ = conn.SetDeadline(dl)
	_, ex, err := nbdclient.Handshake(conn, export, nbdclient.Options{})
	if err != nil {
		return -1, ex, err
	}
	fd, err := evloop.Dup(conn)
	return fd, ex, err
}

// slot is one request in flight; its index is the request's cookie.
type slot struct {
	id   int // its index, the cookie
	op   int // index in the job's ops
	cmd  byte
	off  int64
	n    int
	sent time.Time
	hdr  [nbd.RequestLen]byte // the request as sent, until it is
}

// replayer is one client on a loop. Every field is the loop's.
type replayer struct {
	l        *fleetLoop
	job      job
	fd       int
	flags    nbd.TransmissionFlags
	start    time.Time
	deadline time.Time

	next  int // the next op to send
	slots []slot
	free  []int // free slots, a stack
	// out is what is queued to send: request headers (in their slots)
	// and payloads (in the fleet's shared buffers), written with writev
	// as they are, so a client with megabytes of writes queued neither
	// copies nor holds them.
	out      [][]byte
	hdr      [nbd.SimpleReplyLen]byte
	have     int   // bytes of hdr read
	reading  *slot // the read whose data is arriving
	left     int   // bytes of its data still to come
	stopped  bool  // sends no more
	finished bool
	res      clientResult
	onDone   func()
}

// begin registers the client's socket and sends what is due.
func (c *replayer) begin() {
	if err := c.l.Add(c.fd, c); err != nil {
		c.finish(err)
		return
	}
	c.l.clients = append(c.l.clients, c)
	now := time.Now()
	// A reader's time runs from its connection (nbd-server forks a
	// process to accept one); a boot's from its first attempt.
	c.deadline = now.Add(c.job.runFor)
	c.pump(now)
}

// Ready handles the socket's events.
func (c *replayer) Ready(ev uint32) {
	if c.finished {
		return
	}
	if ev&evloop.Writable != 0 && len(c.out) > 0 {
		if !c.flush() {
			return
		}
	}
	if ev&evloop.Readable != 0 {
		if !c.receive() {
			return
		}
	}
	c.pump(time.Now())
}

// pump sends every request that is due while a slot is free, and ends
// the client once it has sent everything and every reply is in.
func (c *replayer) pump(now time.Time) {
	j := &c.job
	for !c.stopped && len(c.free) > 0 {
		if c.next == len(j.ops) {
			if !j.cycle {
				c.stopped = true
				break
			}
			c.next = 0
		}
		if j.cycle && now.After(c.deadline) {
			c.stopped = true
			break
		}
		o := j.ops[c.next]
		if j.scale > 0 && now.Before(c.start.Add(time.Duration(float64(o.at)*j.scale))) {
			break
		}
		c.send(c.next, o, now)
		c.next++
	}
	if len(c.out) > 0 && !c.flush() {
		return
	}
	if c.stopped && len(c.free) == len(c.slots) {
		c.finish(nil)
	}
}

// send queues one request.
func (c *replayer) send(i int, o op, now time.Time) {
	r := nbd.Request{Cmd: nbd.CmdRead, Offset: uint64(o.off), Length: o.n}
	var payload []byte
	switch o.cmd {
	case 'W':
		r.Cmd, payload = nbd.CmdWrite, c.l.f.fill[:o.n]
	case 'Z':
		if c.flags&nbd.FlagSendWriteZeroes != 0 {
			r.Cmd = nbd.CmdWriteZeroes
		} else {
			if int(o.n) > len(c.l.zero) {
				c.l.zero = make([]byte, o.n) // queued sends keep the old one
			}
			r.Cmd, payload = nbd.CmdWrite, c.l.zero[:o.n]
		}
	case 'F':
		r = nbd.Request{Cmd: nbd.CmdFlush}
	case 'T':
		r.Cmd = nbd.CmdTrim
	}
	s := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	c.slots[s] = slot{id: s, op: i, cmd: o.cmd, off: o.off, n: int(o.n), sent: now}
	r.Cookie = uint64(s)
	c.out = append(c.out, r.Append(c.slots[s].hdr[:0]))
	if len(payload) > 0 {
		c.out = append(c.out, payload)
	}
}

// flush writes what the socket takes; false means the client failed.
func (c *replayer) flush() bool {
	n, err := evloop.Writev(c.fd, c.out)
	if err != nil {
		c.finish(fmt.Errorf("nbd: write: %w", err))
		return false
	}
	// What the socket did not take waits for its Writable edge.
	k := 0
	for k < len(c.out) && n >= len(c.out[k]) {
		n -= len(c.out[k])
		k++
	}
	if k < len(c.out) {
		c.out[k] = c.out[k][n:]
	}
	c.out = c.out[:copy(c.out, c.out[k:])]
	return true
}

// receive reads until the socket is drained; false means the client
// failed. Copying clients read whatever is there into the loop's buffer;
// discarding ones read each header exactly and drop the data after it.
func (c *replayer) receive() bool {
	for {
		var n, want int
		var err error
		var buf []byte
		drop := c.l.f.discard && c.left > 0
		if drop {
			want = c.left
			n, err = evloop.Discard(c.fd, want)
		} else {
			buf = c.l.scratch
			if c.l.f.discard {
				buf = c.hdr[c.have:]
			}
			want = len(buf)
			n, err = evloop.Read(c.fd, buf)
		}
		switch {
		case err != nil:
			c.finish(fmt.Errorf("nbd: receive: %w", err))
			return false
		case n < 0:
			return true
		case n == 0:
			c.finish(io.ErrUnexpectedEOF)
			return false
		}
		if drop {
			c.left -= n
			c.res.reads += int64(n)
			if c.left == 0 {
				c.done(c.reading, nil)
			}
		} else if err := c.consume(buf[:n]); err != nil {
			c.finish(err)
			return false
		}
		// A short read emptied the socket: its next data raises a new edge.
		if n < want {
			return true
		}
	}
}

// consume parses replies from p: headers, and the data of reads.
func (c *replayer) consume(p []byte) error {
	for len(p) > 0 {
		if c.left > 0 {
			k := min(len(p), c.left)
			if chk := c.l.f.check; chk != nil {
				if err := chk(c.reading.off+int64(c.reading.n-c.left), p[:k]); err != nil {
					return err
				}
			}
			c.left -= k
			c.res.reads += int64(k)
			p = p[k:]
			if c.left == 0 {
				c.done(c.reading, nil)
			}
			continue
		}
		k := copy(c.hdr[c.have:], p)
		c.have += k
		p = p[k:]
		if c.have < len(c.hdr) {
			continue
		}
		c.have = 0
		r, err := nbd.ParseSimpleReply(c.hdr[:])
		if err != nil {
			return err
		}
		if r.Cookie >= uint64(len(c.slots)) || c.isFree(int(r.Cookie)) {
			return fmt.Errorf("nbd: reply for cookie %d, which is not in flight", r.Cookie)
		}
		s := &c.slots[r.Cookie]
		switch {
		case r.Error != 0:
			c.done(s, fmt.Errorf("nbd: server answered %c at %d with error %d", s.cmd, s.off, r.Error))
		case s.cmd == 'R' && s.n > 0:
			c.reading, c.left = s, s.n
		default:
			c.done(s, nil)
		}
	}
	return nil
}

func (c *replayer) isFree(s int) bool {
	for _, f := range c.free {
		if f == s {
			return true
		}
	}
	return false
}

// done completes the request in s: its latency, and its slot freed.
func (c *replayer) done(s *slot, err error) {
	d := time.Since(s.sent)
	if d > slowRequest {
		c.res.slow++
		c.res.slowCmd[slowKind(s.cmd)]++
		c.res.slowAt = append(c.res.slowAt, s.sent.Sub(c.start))
	}
	if c.res.lat != nil {
		c.res.lat[s.op] = report.Millis(d)
	}
	if err != nil && c.res.err == nil {
		c.res.err = err
	}
	c.free = append(c.free, s.id)
	if s == c.reading {
		c.reading = nil
	}
}

// finish ends the client: with NBD_CMD_DISC when all went well, else
// noting err; either way its socket is closed.
func (c *replayer) finish(err error) {
	if c.finished {
		return
	}
	c.finished = true
	if err == nil {
		d := nbd.Request{Cmd: nbd.CmdDisc}
		_, _ = evloop.Write(c.fd, d.Append(nil))
	} else if c.res.err == nil {
		c.res.err = err
	}
	c.l.Remove(c.fd)
	unix.Close(c.fd)
	c.onDone()
}
