package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/store"
)

// TestCommandLifecycle: a command is handed out once, answered once by
// its own host, reads as expired when nobody takes or answers it in
// time, cannot be queued for an ended session, and goes with its host.
func TestCommandLifecycle(t *testing.T) {
	eachStore(t, func(t *testing.T, open func() *store.Store) {
		ctx := context.Background()
		s := open()
		f := setup(t, s)
		f.host("h1", "desk", "", 5, 5)
		f.host("h2", "desk", "", 5, 5)
		p := f.mustLaunch("alice")
		ttl := 2 * time.Minute
		c, err := s.QueueCommand(ctx, p.SessionID, "logoff", "", t0)
		if err != nil || c.Host != p.Host || c.User != "alice" || c.State != store.CommandPending {
			t.Fatalf("queue = %+v, %v", c, err)
		}
		other := "h1"
		if p.Host == "h1" {
			other = "h2"
		}
		if got, _ := s.TakeCommands(ctx, other, t0, ttl); len(got) != 0 {
			t.Fatalf("host %s was handed %s's command: %+v", other, p.Host, got)
		}
		got, err := s.TakeCommands(ctx, p.Host, t0.Add(time.Second), ttl)
		if err != nil || len(got) != 1 || got[0].ID != c.ID || got[0].Kind != "logoff" || got[0].User != "alice" {
			t.Fatalf("take = %+v, %v", got, err)
		}
		if again, _ := s.TakeCommands(ctx, p.Host, t0.Add(2*time.Second), ttl); len(again) != 0 {
			t.Fatalf("a command was handed out twice: %+v", again)
		}
		if err := s.FinishCommand(ctx, other, "", c.ID, "", t0); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("another host answered the command: %v", err)
		}
		if st, _ := s.CommandByID(ctx, c.ID, t0.Add(3*time.Minute), ttl); st.State != store.CommandExpired || st.Error == "" {
			t.Fatalf("a command sent and never answered reads %+v past its time", st)
		}
		if err := s.FinishCommand(ctx, p.Host, "an-earlier-registration", c.ID, "", t0); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a removed registration of the host answered its command: %v", err)
		}
		if err := s.FinishCommand(ctx, p.Host, "", c.ID, "no session", t0.Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := s.FinishCommand(ctx, p.Host, "", c.ID, "", t0.Add(6*time.Second)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a command was answered twice: %v", err)
		}
		if st, _ := s.CommandByID(ctx, c.ID, t0.Add(time.Hour), ttl); st.State != store.CommandFailed || st.Error != "no session" {
			t.Fatalf("answered command = %+v", st)
		}
		// Nobody takes this one: it is expired, and never handed out late.
		late, _ := s.QueueCommand(ctx, p.SessionID, "message", "hello", t0)
		if st, _ := s.CommandByID(ctx, late.ID, t0.Add(3*time.Minute), ttl); st.State != store.CommandExpired {
			t.Fatalf("an untaken command reads %+v past its time", st)
		}
		if got, _ := s.TakeCommands(ctx, p.Host, t0.Add(3*time.Minute), ttl); len(got) != 0 {
			t.Fatalf("an expired command was handed out: %+v", got)
		}
		// A logoff queued for a session that then ends is not handed out
		// to end the user's next session on that host.
		stale, err := s.QueueCommand(ctx, p.SessionID, "logoff", "", t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.s.Heartbeat(ctx, store.Report{Host: p.Host, Now: t0.Add(10 * time.Minute), LogonGrace: time.Minute, DiskIdle: 0.9}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.launch("alice", func(l *store.Launch) { l.Now = t0.Add(10 * time.Minute) }); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.TakeCommands(ctx, p.Host, t0.Add(10*time.Minute), time.Hour); len(got) != 0 {
			t.Fatalf("a logoff for an ended session was handed out: %+v", got)
		}
		if st, _ := s.CommandByID(ctx, stale.ID, t0.Add(10*time.Minute), time.Hour); st.State != store.CommandFailed || st.Error == "" {
			t.Fatalf("a command whose session ended reads %+v", st)
		}
		if _, err := s.QueueCommand(ctx, "no-such-session", "logoff", "", t0); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("queue for an unknown session: %v", err)
		}
		if _, err := s.QueueCommand(ctx, p.SessionID, "logoff", "", t0); !errors.Is(err, store.ErrSessionEnded) {
			t.Fatalf("queue for an ended session: %v", err)
		}
		// A host removed and joined again does not inherit commands.
		p2 := f.mustLaunch("bob")
		if _, err := s.QueueCommand(ctx, p2.SessionID, "disconnect", "", t0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.EndSession(ctx, p2.SessionID, t0); err != nil {
			t.Fatal(err)
		}
		if err := s.RemoveHost(ctx, p2.Host); err != nil {
			t.Fatal(err)
		}
		f.host(p2.Host, "desk", "", 5, 5)
		if got, _ := s.TakeCommands(ctx, p2.Host, t0.Add(time.Second), ttl); len(got) != 0 {
			t.Fatalf("a host joined under a removed host's name took its commands: %+v", got)
		}
	})
}
