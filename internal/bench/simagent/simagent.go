// Package simagent is the report loop of a simulated session host's
// agent, for the benches that storm a broker with many such hosts: at each
// poll it reports the changes agent.Diff finds in the host's session list,
// and at each heartbeat the list as last polled, as the real agent does.
// How the reports reach a broker (one client, a balancer over several) and
// what is recorded of them is the caller's.
package simagent

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/agent"
	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// Agent is one simulated host's agent.
type Agent struct {
	// Host is the host's name in its reports.
	Host string
	// Poll is how often the session list is read; Beat how often a
	// heartbeat goes.
	Poll, Beat time.Duration
	// View is the host's session list at now.
	View func(now time.Time) []brokerapi.Session
	// Events sends a poll's changes. As the real agent does, a report
	// that fails is not sent again: the next heartbeat carries the
	// reading and the broker reconciles.
	Events func(ctx context.Context, ev brokerapi.Events)
	// Heartbeat sends a heartbeat.
	Heartbeat func(ctx context.Context, hb brokerapi.Heartbeat)
}

// Run reports until ctx ends. As the real agent does, the polls hand
// their changes to a reporter (agent.Outbox) and never wait on the
// broker; the reporter sends events, and heartbeats with the latest
// reading, one at a time and in order.
func (a Agent) Run(ctx context.Context) {
	// Agents that started together do not poll or beat in lockstep.
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Duration(rand.Int64N(int64(a.Poll)))):
	}
	out := agent.NewOutbox(nil)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.report(ctx, out) }()
	defer wg.Wait()
	pt := time.NewTicker(a.Poll)
	defer pt.Stop()
	var known []brokerapi.Session
	for {
		select {
		case <-ctx.Done():
			return
		case <-pt.C:
			cur := a.View(time.Now())
			// The reading is kept whether or not its events are
			// answered: keeping the old one until they are would make
			// the next heartbeat say the users are gone when a broker
			// applied the events and died before answering, and another
			// broker would end their placed sessions.
			out.Read(cur, agent.Diff(known, cur))
			known = cur
		}
	}
}

// report sends what out holds until ctx ends.
func (a Agent) report(ctx context.Context, out *agent.Outbox) {
	bt := time.NewTicker(a.Beat)
	defer bt.Stop()
	send := func() {
		if ev, _ := out.Take(); len(ev) > 0 {
			a.Events(ctx, brokerapi.Events{Host: a.Host, Events: ev})
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-out.Wake():
			send()
		case <-bt.C:
			send()
			a.Heartbeat(ctx, brokerapi.Heartbeat{Host: a.Host, CPU: 0.3, Memory: 0.4, DiskIdle: 0.9, DiskLatencyMS: 4,
				Sessions: append([]brokerapi.Session{}, out.Latest()...)})
		}
	}
}
