package gateway

import (
	"fmt"
	"time"

	"github.com/deskway/deskway/internal/evloop"
)

// sendBatch holds a relay loop's small writes of one round of events,
// which it makes together at the round's end (evloop.SendAll: one
// io_uring submission). An interactive tunnel's message costs a read and
// a write on each side, and on a virtual machine with page-table
// isolation a system call's entry and exit are much of what a small
// loopback write costs; a round with events on many tunnels then makes
// one call for all their writes.
type sendBatch struct {
	sends    []evloop.Send
	starts   []int        // where each send's bytes begin in arena
	to       []sendResult // who hears how each went
	arena    []byte       // the bytes of the sends, copied: the loop's buffers are reused within the round
	flushing bool
}

// sendResult is told how much of p a batched send got into its socket.
type sendResult interface {
	sent(p []byte, n int, err error)
}

// Bounds of the batch: a send larger than deferMax (bulk data) goes at
// once, where it costs a system call of its own either way and copying
// it would cost more; arenaMax bounds what one round holds.
const (
	deferMax = 16 << 10
	arenaMax = 1 << 20
)

// room is how large a send may be to join the round's batch.
func (l *relayLoop) room() int { return min(deferMax, arenaMax-len(l.arena)) }

// queueSend adds a copy of p for fd to the round's sends; to hears of the
// outcome once they are made. A socket has at most one send in a batch
// (see evloop.SendAll): its later bytes extend it or queue behind it.
func (l *relayLoop) queueSend(fd int, p []byte, to sendResult) {
	if len(l.sends) == 0 {
		l.AtEnd(batchEnd{l})
	}
	start := len(l.arena)
	l.arena = append(l.arena, p...)
	l.sends = append(l.sends, evloop.Send{FD: fd, P: l.arena[start:len(l.arena):len(l.arena)]})
	l.starts = append(l.starts, start)
	l.to = append(l.to, to)
}

// extendSend appends p to fd's send of this round when that is the last
// one queued and stays within deferMax; otherwise the caller queues p.
func (l *relayLoop) extendSend(fd int, p []byte) bool {
	k := len(l.sends) - 1
	if l.flushing || k < 0 || l.sends[k].FD != fd || len(l.sends[k].P)+len(p) > l.room() {
		return false
	}
	l.arena = append(l.arena, p...)
	l.sends[k].P = l.arena[l.starts[k]:len(l.arena):len(l.arena)]
	return true
}

type batchEnd struct{ l *relayLoop }

// Ready implements evloop.Handler: the round is over.
func (b batchEnd) Ready(uint32) { b.l.flushSends() }

// flushSends makes the round's sends and reports each outcome.
func (l *relayLoop) flushSends() {
	if len(l.sends) == 0 || l.flushing {
		return
	}
	l.flushing = true
	l.SendAll(l.sends)
	for i := range l.sends {
		s := &l.sends[i]
		l.to[i].sent(s.P, s.N, s.Err)
	}
	clear(l.sends)
	clear(l.to)
	l.sends, l.starts, l.to = l.sends[:0], l.starts[:0], l.to[:0]
	l.arena = l.arena[:0]
	if cap(l.arena) > arenaMax {
		l.arena = nil
	}
	l.flushing = false
}

// sent implements sendResult for the bytes to the client.
func (c clientSide) sent(p []byte, n int, err error) {
	r := c.r
	err = r.lc.sent(p, n, err)
	if r.torn || r.ended {
		return
	}
	if err != nil {
		r.end(err)
		return
	}
	// Reading the host waits while the client's bytes are queued, and
	// the drain while they are many: go on if they went.
	if !r.lc.queued() && (r.hostIn || r.drain) {
		r.loop.Again(r)
	}
}

// sent implements sendResult for the bytes to the host.
func (h hostSide) sent(p []byte, n int, err error) {
	r := h.r
	r.upLater = false
	if r.torn || r.ended {
		return
	}
	if err != nil {
		err = fmt.Errorf("write: %w", err)
		r.tn.reasonf("%s", r.tn.writeFailure("host", err))
		r.end(err)
		return
	}
	if n < len(p) {
		r.upQueue = append(append(make([]byte, 0, len(p)-n+len(r.upQueue)), p[n:]...), r.upQueue...)
		r.hostStall.Store(time.Now().UnixNano())
		return
	}
	if len(r.upQueue) == 0 {
		return
	}
	// Client bytes queued behind p stopped the drain: send them now, and
	// go on draining once they are all taken.
	k, err := evloop.Write(r.hfd, r.upQueue)
	if err != nil {
		r.tn.reasonf("host write: %v", err)
		r.end(err)
		return
	}
	r.upQueue = r.upQueue[:copy(r.upQueue, r.upQueue[k:])]
	if len(r.upQueue) > 0 {
		r.hostStall.Store(time.Now().UnixNano())
		return
	}
	r.hostStall.Store(0)
	r.drain = true
	r.loop.Again(r)
}
