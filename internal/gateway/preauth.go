package gateway

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/admission"
	"github.com/deskway/deskway/internal/auth"
)

// preauth admits connections that have not yet opened a channel. Anyone
// can open one, so they have caps of their own (in all, and per source
// address) that authorized tunnels never share, and each lives at most
// one wall-clock budget from accept, whatever it does meanwhile: slow
// TLS, NTLM rounds on a kept-alive connection, a websocket that never
// finishes its handshake, or a legacy half that is never paired.
type preauth struct {
	*admission.Limiter
	budget time.Duration
}

func newPreauth(max, perAddr int, budget time.Duration) *preauth {
	return &preauth{Limiter: admission.New(max, perAddr), budget: budget}
}

// admit takes a slot for a connection from a, or says which cap is full.
func (p *preauth) admit(a netip.Addr) (netip.Prefix, string) { return p.Admit(a, "the gateway") }

// count is how many connections hold a slot now, for the metrics.
func (p *preauth) count() float64 { return float64(p.Count()) }

func (p *preauth) release(k netip.Prefix) { p.Release(k) }

// connState is per TCP connection: HTTP NTLM authenticates the
// connection, so the exchange and its result live here, not in a request;
// and so does the connection's pre-authentication slot and budget.
type connState struct {
	remote netip.Addr
	// Owned by the goroutine serving the connection's requests.
	ntlm *auth.NTLMExchange
	user *auth.User

	pa       *preauth
	key      netip.Prefix
	raw      net.Conn // beneath TLS, closed when the budget runs out
	accepted time.Time
	deadline time.Time
	// served is the gateway's own time answering the connection's RDG
	// requests (NTLM's rounds, the upgrade or the legacy halves' answers),
	// in nanoseconds; a legacy OUT half's is read by its IN half's goroutine.
	served atomic.Int64
	// bare: from a trusted balancer's address without a PROXY header,
	// where only farm peers' links are served.
	bare bool

	mu       sync.Mutex
	timer    *time.Timer
	released bool // the budget is over: authorized, expired or closed
	expired  bool
	// slotFreed: the slot was given back early by exempt, the budget
	// still runs.
	slotFreed bool
}

// exempt gives back the connection's slot but keeps its budget: a farm
// peer's link, whose one address carries many clients' halves.
func (c *connState) exempt() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released || c.slotFreed {
		return
	}
	c.slotFreed = true
	c.pa.release(c.key)
}

// giveBack releases the slot unless exempt already did; c.mu is held.
func (c *connState) giveBack() {
	if !c.slotFreed {
		c.slotFreed = true
		c.pa.release(c.key)
	}
}

// start arms the budget; the connection is closed when it runs out.
func (c *connState) start() {
	c.mu.Lock()
	c.timer = time.AfterFunc(time.Until(c.deadline), c.expire)
	c.mu.Unlock()
}

func (c *connState) expire() {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.released, c.expired = true, true
	c.giveBack()
	c.mu.Unlock()
	_ = c.raw.Close()
}

// authorize ends the pre-authentication phase: the connection carries an
// open channel now. It reports false if the budget ran out first.
func (c *connState) authorize() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expired {
		return false
	}
	if !c.released {
		c.released = true
		c.timer.Stop()
		c.giveBack()
	}
	return true
}

// finish gives the slot back when the connection ends before its budget.
func (c *connState) finish() {
	c.mu.Lock()
	if c.released {
		c.mu.Unlock()
		return
	}
	c.released = true
	c.timer.Stop()
	c.giveBack()
	c.mu.Unlock()
}

// timedOut reports whether the budget ran out before a channel opened.
func (c *connState) timedOut() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.expired
}
