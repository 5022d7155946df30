package agent

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// maxQueuedEvents bounds the session events waiting for a broker that
// does not answer: past it the oldest go (the heartbeats carry the
// sessions all the same, and the broker reconciles with them).
const maxQueuedEvents = 10000

// Outbox is what an agent's session polls hand its reporter, so that
// reading the sessions never waits on the broker: the events not yet
// sent, in the order they happened, and the latest reading, which the
// next heartbeat carries. The bench's simulated agents use it as the
// agent does.
type Outbox struct {
	mu       sync.Mutex
	events   []brokerapi.Event
	dropped  int
	sessions []brokerapi.Session
	wake     chan struct{}
}

// NewOutbox returns an outbox whose latest reading is sessions.
func NewOutbox(sessions []brokerapi.Session) *Outbox {
	return &Outbox{sessions: sessions, wake: make(chan struct{}, 1)}
}

// Read records a poll: its reading, and the events it found.
func (o *Outbox) Read(sessions []brokerapi.Session, ev []brokerapi.Event) {
	o.mu.Lock()
	o.sessions = sessions
	o.events = append(o.events, ev...)
	if over := len(o.events) - maxQueuedEvents; over > 0 {
		o.events = o.events[over:]
		o.dropped += over
	}
	o.mu.Unlock()
	if len(ev) > 0 {
		select {
		case o.wake <- struct{}{}:
		default:
		}
	}
}

// Take returns the queued events, emptying the queue, and how many were
// dropped for want of room since the last take.
func (o *Outbox) Take() (ev []brokerapi.Event, dropped int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ev, dropped = o.events, o.dropped
	o.events, o.dropped = nil, 0
	return ev, dropped
}

// Wake receives once events are queued.
func (o *Outbox) Wake() <-chan struct{} { return o.wake }

// Latest is the reading of the last poll.
func (o *Outbox) Latest() []brokerapi.Session {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.sessions
}

// report sends what out holds, the heartbeats and the renewals, one at a
// time and in order, until ctx ends or a heartbeat or renewal fails for
// good. Events queued before a heartbeat go before it. A report the
// broker refuses is not sent again: the next heartbeat carries the
// sessions as last read, and the broker reconciles.
func (a *Agent) report(ctx context.Context, out *Outbox, w *loadWindow) error {
	// A farm's agents start together after an outage; a tenth of jitter
	// keeps their heartbeats from arriving in lockstep.
	heartbeat := time.NewTicker(a.beat + time.Duration(rand.Int64N(int64(a.beat)/10+1)))
	defer heartbeat.Stop()
	renew := time.NewTicker(renewEvery)
	defer renew.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-out.Wake():
			a.sendEvents(ctx, out)
		case <-heartbeat.C:
			a.sendEvents(ctx, out)
			if err := a.heartbeat(ctx, w, out.Latest()); err != nil {
				return err
			}
		case <-renew.C:
			if err := a.register(ctx); err != nil {
				return err
			}
		}
	}
}

// sendEvents sends the queued events as one report.
func (a *Agent) sendEvents(ctx context.Context, out *Outbox) {
	ev, dropped := out.Take()
	if dropped > 0 {
		a.d.Logger.Warn("session events dropped while the broker did not take them; its reconciliation with the heartbeats stands in for them", "dropped", dropped)
	}
	if len(ev) == 0 {
		return
	}
	if err := a.d.Client.Events(ctx, a.cred, brokerapi.Events{Host: a.cfg.Name, Events: ev}); err != nil && ctx.Err() == nil {
		a.d.Logger.Warn("reporting session events; the next heartbeat carries the sessions and the broker reconciles", "error", err)
	}
}
