package simagent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// TestAgentReportsALogonOnceAndKeepsItInHeartbeats: a session that shows
// on the host is reported once as an event, whether or not the report was
// answered, and every heartbeat after names it; the loop ends with its
// context.
func TestAgentReportsALogonOnceAndKeepsItInHeartbeats(t *testing.T) {
	var shown atomic.Bool
	evs := make(chan brokerapi.Events, 16)
	hbs := make(chan brokerapi.Heartbeat, 64)
	a := Agent{
		Host: "h1", Poll: 5 * time.Millisecond, Beat: 7 * time.Millisecond,
		View: func(time.Time) []brokerapi.Session {
			if shown.Load() {
				return []brokerapi.Session{{User: "alice", State: "active"}}
			}
			return nil
		},
		// The events are never answered: the loop must not send them again.
		Events: func(_ context.Context, ev brokerapi.Events) { evs <- ev },
		Heartbeat: func(_ context.Context, hb brokerapi.Heartbeat) {
			select {
			case hbs <- hb:
			default: // the test reads a few; a full channel must not stall the loop
			}
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	shown.Store(true)
	deadline := time.After(10 * time.Second)
	select {
	case ev := <-evs:
		if ev.Host != "h1" || len(ev.Events) != 1 || ev.Events[0] != (brokerapi.Event{User: "alice", State: "active"}) {
			t.Fatalf("events %+v, want alice active from h1", ev)
		}
	case <-deadline:
		t.Fatal("no events within 10 s")
	}
	for named := 0; named < 3; {
		select {
		case hb := <-hbs:
			if hb.Host != "h1" || hb.CPU != 0.3 || hb.Memory != 0.4 || hb.DiskIdle != 0.9 || hb.DiskLatencyMS != 4 {
				t.Fatalf("heartbeat %+v", hb)
			}
			if len(hb.Sessions) == 1 && hb.Sessions[0].User == "alice" {
				named++
			}
		case ev := <-evs:
			t.Fatalf("events sent again: %+v", ev)
		case <-deadline:
			t.Fatalf("%d heartbeats named alice within 10 s, want 3", named)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
