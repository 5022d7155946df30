package gateway

import (
	"context"
	"errors"
	"net"
	"time"
)

// hostDialStagger is how long a dial to a session host waits for an
// answer before it sends another attempt beside the first.
const hostDialStagger = 250 * time.Millisecond

// hostDialAttempts bounds the attempts one dial sends at once.
const hostDialAttempts = 8

// staggeredDialer connects to session hosts. A host whose listen queue
// is full drops the SYN, and the kernel sends it again only after 1 s,
// then 3 s: xrdp listens with a queue of two, so when a gateway node
// dies and its users all reconnect through the others at once, most of
// their dials waited 1 or 2 s for the retransmission (dial_ms in the
// fault bench's tunnel lines) while the host had long since made room.
// A dial not answered within stagger sends another attempt beside the
// ones still waiting, as the kernel would but sooner, and takes the
// first that connects.
type staggeredDialer struct {
	d        *net.Dialer
	stagger  time.Duration
	attempts int
}

// DialContext connects to addr as net.Dialer.DialContext does.
func (s staggeredDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		conn net.Conn
		err  error
	}
	// Buffered for every attempt, so that none blocks once we return.
	results := make(chan result, s.attempts)
	started, waiting := 0, 0
	attempt := func() {
		started++
		waiting++
		go func() {
			c, err := s.d.DialContext(ctx, network, addr)
			results <- result{c, err}
		}()
	}
	// closeLate closes the attempts still waiting as they end: any that
	// connects after the dial has returned is no one's.
	closeLate := func() {
		cancel()
		go func(n int) {
			for ; n > 0; n-- {
				if late := <-results; late.conn != nil {
					_ = late.conn.Close()
				}
			}
		}(waiting)
	}
	attempt()
	tick := time.NewTicker(s.stagger)
	defer tick.Stop()
	var firstErr error
	for {
		select {
		case r := <-results:
			waiting--
			if r.err == nil {
				closeLate()
				return r.conn, nil
			}
			if firstErr == nil {
				firstErr = r.err
			}
			// A refusal or an unreachable network is the host's answer,
			// which another attempt would only repeat.
			var ne net.Error
			if waiting == 0 || !(errors.As(r.err, &ne) && ne.Timeout()) {
				closeLate()
				return nil, firstErr
			}
		case <-tick.C:
			if started < s.attempts && ctx.Err() == nil {
				attempt()
			}
		}
	}
}
