package broker_test

import (
	"context"
	"testing"

	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/testkit"
)

// TestRefreshKeepsWhatChangedWhileItRead: the broker reloads its local
// host cache from the database now and then. A logoff and a launch that
// go through the broker while a reload is reading the database must stay
// in the copy, or the database's failure soon after sends the user who
// logged off back to the session they left, and gives the user who
// launched a second session. (A clean-clone run of TestOutageModel once
// ended with a user's live session other than the one its launch
// answered.)
func TestRefreshKeepsWhatChangedWhileItRead(t *testing.T) {
	pg := testkit.StartPostgres(t)
	ctx := context.Background()
	w := newWorld(t, "broker", pg.NewDB(t), []string{"h1", "h2"})
	w.launch(t, "u1")
	w.event(t, "u1", store.Active)
	apply, err := broker.ReadForCache(ctx, w.r.b)
	if err != nil {
		t.Fatal(err)
	}
	w.event(t, "u1", store.Ended)
	u2 := w.launch(t, "u2")
	apply()
	if err := pg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if again := w.launch(t, "u1"); again.Reconnect {
		t.Errorf("u1, logged off, launched again in the outage: sent back to session %s", again.SessionID)
	}
	if again := w.launch(t, "u2"); !again.Reconnect || again.SessionID != u2.SessionID {
		t.Errorf("u2 launched again in the outage: %+v, want a reconnect to %s", again, u2.SessionID)
	}
}
