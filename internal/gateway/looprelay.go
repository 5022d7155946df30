package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/evloop"
	"github.com/deskway/deskway/internal/proto/tsgu"
)

// relayLoop is one event loop that relays open websocket tunnels, with
// the read buffers its tunnels share: a tunnel only needs a buffer while
// the loop is working on it.
type relayLoop struct {
	*evloop.Loop
	in        []byte // client reads
	pkts      []byte // lent to a tunnel's MS-TSGU reader while it drains
	frame     []byte // host reads, with headroom for the framing
	held      []byte // TLS records of one host read, sent together
	sendBatch        // the round's small writes, made together at its end

	// watched are the loop's tunnels, which its watchdog sweeps for
	// keepalives and timeouts: one timer per loop, where a timer per
	// tunnel cost a timer, a closure and a goroutine every few seconds.
	mu         sync.Mutex // guards watched, dog and dogStopped
	watched    map[*tunnel]struct{}
	dog        *time.Timer
	dogStopped bool
	batch      []*tunnel // the sweep's own
}

// loopPacketBuf is the size of the buffer a loop lends its tunnels' MS-TSGU
// readers: a whole data packet of the largest size fits.
const loopPacketBuf = tsgu.DataHeaderLen + tsgu.MaxDataLen

// relayLoops is the gateway's set of loops; tunnels are spread round-robin.
type relayLoops struct {
	loops []*relayLoop
	next  atomic.Uint32
}

// startRelayLoops starts n loops, whose watchdogs send a keepalive once a
// tunnel has sent nothing for keep; log hears of a loop that fails.
func startRelayLoops(n int, keep time.Duration, log *slog.Logger) (*relayLoops, error) {
	rl := &relayLoops{}
	for range n {
		l, err := evloop.New()
		if err != nil {
			rl.close()
			return nil, err
		}
		loop := &relayLoop{Loop: l, in: make([]byte, 64<<10), pkts: make([]byte, loopPacketBuf),
			frame: make([]byte, headroom+relayBufMax), held: make([]byte, 0, headroom+relayBufMax+1024),
			watched: make(map[*tunnel]struct{})}
		rl.loops = append(rl.loops, loop)
		go func() {
			if err := l.Run(); err != nil {
				log.Error("relay loop stopped; its tunnels end when stopped or timed out", "err", err)
			}
		}()
		loop.mu.Lock()
		loop.dog = time.AfterFunc(watchInterval(keep), func() { loop.sweep(keep) })
		loop.mu.Unlock()
	}
	return rl, nil
}

// sweep checks every tunnel of the loop for keepalives and timeouts, as
// often as a tunnel's own timer did (watchInterval). It runs beside the
// loop, not on it: a check may write a keepalive or stop a tunnel, which
// the loop's goroutine must not wait for. Sweeps never overlap: the next
// is armed when this one is through.
func (l *relayLoop) sweep(keep time.Duration) {
	l.mu.Lock()
	for tn := range l.watched {
		l.batch = append(l.batch, tn)
	}
	l.mu.Unlock()
	for _, tn := range l.batch {
		if !tn.check(keep) {
			l.unwatch(tn)
		}
	}
	clear(l.batch)
	l.batch = l.batch[:0]
	l.mu.Lock()
	if !l.dogStopped {
		l.dog.Reset(watchInterval(keep))
	}
	l.mu.Unlock()
}

func (l *relayLoop) watch(tn *tunnel) {
	l.mu.Lock()
	l.watched[tn] = struct{}{}
	l.mu.Unlock()
}

func (l *relayLoop) unwatch(tn *tunnel) {
	l.mu.Lock()
	delete(l.watched, tn)
	l.mu.Unlock()
}

func (rl *relayLoops) pick() *relayLoop {
	return rl.loops[int(rl.next.Add(1))%len(rl.loops)]
}

// close stops the loops and their watchdogs; call it once no tunnel uses
// them.
func (rl *relayLoops) close() {
	for _, l := range rl.loops {
		l.mu.Lock()
		l.dogStopped = true
		if l.dog != nil {
			l.dog.Stop()
		}
		l.mu.Unlock()
		l.Close()
	}
}

// loopRelay is one open websocket tunnel served by a relayLoop. Every
// field is the loop goroutine's, apart from started.
type loopRelay struct {
	tn   *tunnel
	loop *relayLoop
	wt   *wsTransport
	lc   *loopConn
	cfd  int // client socket
	hfd  int // host socket

	clientIn, hostIn bool   // the socket may hold unread bytes
	drain            bool   // the framing layers may hold a whole packet
	upQueue          []byte // for the host, not yet taken by its socket
	upLater          bool   // the loop's sends of the round hold bytes for the host
	ended, torn      bool
	err              error
	started          sync.WaitGroup // done once relayOnLoop is through
	// hostStall is the unix nanos since which upQueue has waited with no
	// byte taken by the host, 0 while it is empty; the watchdog reads it.
	hostStall atomic.Int64
}

// stalled reports a side whose queue has taken no byte for longer than
// the write timeout, and for how long.
func (r *loopRelay) stalled(now time.Time) (string, time.Duration) {
	limit := r.tn.srv.cfg.WriteTimeout.D()
	for _, s := range []struct {
		side  string
		since int64
	}{{"client", r.lc.stallSince.Load()}, {"host", r.hostStall.Load()}} {
		if s.since != 0 {
			if d := now.Sub(time.Unix(0, s.since)); d > limit {
				return s.side, d
			}
		}
	}
	return "", 0
}

type clientSide struct{ r *loopRelay }
type hostSide struct{ r *loopRelay }

// relayOnLoop hands the open tunnel to an event loop, which relays it
// and finishes it when the relay ends (see after). It returns false, with
// both connections untouched, when the tunnel cannot be moved there (a
// connection without a socket, or the loop refused it).
func (tn *tunnel) relayOnLoop(loops *relayLoops) bool {
	wt, ok := tn.t.(*wsTransport)
	if !ok {
		return false
	}
	tc, ok := wt.conn.(*tls.Conn)
	if !ok {
		return false
	}
	lc, ok := tc.NetConn().(*loopConn)
	if !ok {
		return false
	}
	cfd, err := evloop.Dup(lc.Conn)
	if err != nil {
		return false
	}
	hfd, err := evloop.Dup(tn.upstream)
	if err != nil {
		unix.Close(cfd)
		return false
	}
	l := loops.pick()
	r := &loopRelay{tn: tn, loop: l, wt: wt, lc: lc, cfd: cfd, hfd: hfd}
	// The tunnel's goroutine returns as soon as the loop has the sockets,
	// so the loop's teardown may finish the tunnel before this function
	// is through: it waits for started.
	r.started.Add(1)
	res := make(chan error, 1)
	if err := l.Post(func() { res <- r.register() }); err != nil {
		res <- err
	}
	if err := <-res; err != nil {
		if !errors.Is(err, net.ErrClosed) { // closed: the tunnel was stopped meanwhile
			tn.log.Warn("relaying without the event loop", "err", err)
		}
		unix.Close(cfd)
		unix.Close(hfd)
		return false
	}
	// The duplicates carry the sockets from here on.
	wt.g.onLoop.Store(true)
	_ = lc.Conn.Close()
	_ = tn.upstream.Close()
	tn.onLoop.Store(r)
	l.watch(tn)
	r.started.Done()
	return true
}

// after finishes the tunnel once its relay on the loop has ended, on a
// goroutine of its own: the loop must not wait on the accounting.
func (r *loopRelay) after() {
	r.started.Wait()
	tn := r.tn
	tn.relayDone.Store(true)
	r.loop.unwatch(tn)
	err := r.err
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		err = nil
	}
	tn.finish(err)
}

// register adds both sockets to the loop and hands the client socket to
// the loopConn under TLS.
func (r *loopRelay) register() error {
	if err := r.loop.Add(r.cfd, clientSide{r}); err != nil {
		return err
	}
	if err := r.loop.Add(r.hfd, hostSide{r}); err != nil {
		r.loop.Remove(r.cfd)
		return err
	}
	if err := r.lc.detach(r.cfd, r.closeRequested); err != nil {
		r.loop.Remove(r.cfd)
		r.loop.Remove(r.hfd)
		return fmt.Errorf("client connection: %w", err)
	}
	// TLS and the framing may already hold bytes read during the
	// handshake, and either socket may have become readable before it was
	// added: look at everything once.
	r.clientIn, r.hostIn, r.drain = true, true, true
	r.loop.Again(r)
	return nil
}

// closeRequested is the loopConn's Close, from any goroutine.
func (r *loopRelay) closeRequested() {
	if err := r.loop.Post(r.teardown); err != nil {
		r.teardown() // the loop is gone, so nothing else touches the sockets
	}
}

// teardown closes both sockets and finishes the tunnel.
func (r *loopRelay) teardown() {
	if r.torn {
		return
	}
	r.torn = true
	if r.upLater || r.lc.deferred {
		r.loop.flushSends() // before the descriptors close and may be reused
	}
	r.loop.Remove(r.cfd)
	r.loop.Remove(r.hfd)
	r.lc.closeFD()
	unix.Close(r.hfd)
	go r.after()
}

// end finishes the relay for err (io.EOF for a clean end): the tunnel
// stops, which closes the transport and so, through the loopConn, the
// sockets.
func (r *loopRelay) end(err error) {
	if r.ended {
		return
	}
	r.ended, r.err = true, err
	r.tn.stop("")
}

// Ready implements evloop.Handler for Again.
func (r *loopRelay) Ready(uint32) { r.pump() }

func (c clientSide) Ready(ev uint32) {
	r := c.r
	if ev&evloop.Readable != 0 {
		r.clientIn = true
	}
	if ev&evloop.Writable != 0 && !r.torn {
		if _, err := r.lc.flush(); err != nil {
			r.end(err)
			return
		}
	}
	r.pump()
}

func (h hostSide) Ready(ev uint32) {
	r := h.r
	if ev&evloop.Readable != 0 {
		r.hostIn = true
	}
	if ev&evloop.Writable != 0 && len(r.upQueue) > 0 && !r.upLater && !r.ended {
		n, err := evloop.Write(r.hfd, r.upQueue)
		if err != nil {
			r.tn.reasonf("host write: %v", err)
			r.end(err)
			return
		}
		r.upQueue = r.upQueue[:copy(r.upQueue, r.upQueue[n:])]
		switch {
		case len(r.upQueue) == 0:
			r.drain = true
			r.hostStall.Store(0)
		case n > 0:
			r.hostStall.Store(time.Now().UnixNano())
		}
	}
	r.pump()
}

// pumpBudget is how many reads one tunnel gets before the loop moves on
// to the others; a bulk transfer then continues in the next round.
const pumpBudget = 16

// pump moves what can move without blocking: client bytes through TLS,
// websocket and MS-TSGU to the host while the host takes them, and host
// bytes to the client while the client's queue is empty.
func (r *loopRelay) pump() {
	tn := r.tn
	for range pumpBudget {
		if r.ended || r.torn {
			return
		}
		moved := false
		if r.drain && r.canDrain() {
			if err := r.drainClient(); err != nil {
				r.end(err)
				return
			}
		}
		if r.clientIn && !r.drain && r.canDrain() {
			n, err := evloop.Read(r.cfd, r.loop.in)
			switch {
			case err != nil:
				r.end(tn.clientReadErr(err))
				return
			case n == 0:
				r.end(tn.clientReadErr(io.EOF))
				return
			case n < 0:
				r.clientIn = false
			default:
				r.clientIn = n == len(r.loop.in)
				r.lc.push(r.loop.in[:n])
				if err := r.drainClient(); err != nil {
					r.end(err)
					return
				}
				moved = true
			}
		}
		if r.hostIn && !r.lc.queued() {
			frame := r.loop.frame
			n, err := evloop.Read(r.hfd, frame[headroom:])
			switch {
			case err != nil:
				tn.reasonf("host read: %v", err)
				r.end(err)
				return
			case n == 0:
				tn.closeChannel(tsgu.SOK, "host closed the connection")
				r.end(io.EOF)
				return
			case n < 0:
				r.hostIn = false
			default:
				r.hostIn = n == len(frame)-headroom
				start := time.Now()
				r.lc.cork(r.loop.held)
				err := tn.t.writeData(frame, n)
				held, later, uerr := r.lc.uncork(r.loop.room())
				r.loop.held = held
				if later {
					r.loop.queueSend(r.cfd, held, clientSide{r})
				}
				if err == nil {
					err = uerr
				}
				if err != nil {
					r.end(err)
					return
				}
				tn.sentDown(n, start)
				moved = true
			}
		}
		if !moved {
			return
		}
	}
	r.loop.Again(r)
}

// canDrain reports whether client bytes may be processed now: neither
// the host's queue nor the client's own (answers to its pings) is backed up.
func (r *loopRelay) canDrain() bool { return len(r.upQueue) == 0 && !r.lc.full() }

// drainClient acts on every whole packet the framing layers can produce
// from what was pushed, until they need more bytes or canDrain says stop;
// then what is left of the pushed bytes is kept for later (drain).
func (r *loopRelay) drainClient() error {
	r.drain = false
	r.wt.pr.lend(r.loop.pkts)
	defer r.wt.pr.giveBack()
	for {
		if !r.canDrain() {
			r.lc.keep()
			r.drain = true
			return nil
		}
		pkt, err := r.wt.readPacket()
		if errors.Is(err, errWouldBlock) {
			return nil
		}
		if err != nil {
			return r.tn.clientReadErr(err)
		}
		if err := r.tn.fromClient(pkt, r.writeHost); err != nil {
			return err
		}
	}
}

// writeHost sends p to the host, queueing what its socket does not take.
// A small p goes with the loop's other sends at the round's end.
func (r *loopRelay) writeHost(p []byte) error {
	if len(r.upQueue) > 0 {
		r.upQueue = append(r.upQueue, p...)
		return nil
	}
	if r.upLater {
		if !r.loop.extendSend(r.hfd, p) {
			r.upQueue = append(r.upQueue, p...)
		}
		return nil
	}
	if len(p) <= r.loop.room() {
		r.upLater = true
		r.loop.queueSend(r.hfd, p, hostSide{r})
		return nil
	}
	n, err := evloop.Write(r.hfd, p)
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if n < len(p) {
		r.upQueue = append(r.upQueue, p[n:]...)
		r.hostStall.Store(time.Now().UnixNano())
	}
	return nil
}
