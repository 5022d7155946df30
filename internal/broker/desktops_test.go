package broker_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
)

// TestDesktopsListsEntitlementsAndSessions: a user sees the delivery
// groups they may launch and, in each, the session a launch returns to;
// a front end asks on a user's behalf, and nobody else's sessions show.
func TestDesktopsListsEntitlementsAndSessions(t *testing.T) {
	r := newRig(t, "", nil)
	ctx := context.Background()
	r.agent("h1", "desk", "")
	alice := brokerclient.Basic("alice", "Alice-Pass-1")
	ds, err := r.client.Desktops(ctx, alice, brokerapi.DesktopsRequest{})
	if err != nil || len(ds) != 2 || ds[0].DeliveryGroup != "desk" || ds[1].DeliveryGroup != "mine" || ds[1].Kind != "personal" || ds[0].Session != nil {
		t.Fatalf("alice's desktops before a launch = %+v, %v", ds, err)
	}
	lr, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil {
		t.Fatal(err)
	}
	ds, _ = r.client.Desktops(ctx, alice, brokerapi.DesktopsRequest{})
	if s := ds[0].Session; s == nil || s.ID != lr.SessionID || s.Host != "h1" || s.State != "launching" {
		t.Fatalf("alice's desk after a launch = %+v", ds[0])
	}
	// The launch is the desk's last use; mine was never used.
	if ds[0].LastUsed.IsZero() || time.Since(ds[0].LastUsed) > time.Minute || !ds[1].LastUsed.IsZero() {
		t.Fatalf("alice's last uses after a launch of desk: desk %v, mine %v", ds[0].LastUsed, ds[1].LastUsed)
	}
	if ds, err := r.client.Desktops(ctx, brokerclient.Basic("bob", "Bob-Pass-1"), brokerapi.DesktopsRequest{}); err != nil || len(ds) != 0 {
		t.Fatalf("bob (contractors) sees %+v, %v", ds, err)
	}
	fe := brokerclient.Bearer("frontend-token")
	ds, err = r.client.Desktops(ctx, fe, brokerapi.DesktopsRequest{User: "carol", Groups: []string{"staff"}})
	if err != nil || len(ds) != 1 || ds[0].DeliveryGroup != "desk" || ds[0].Session != nil {
		t.Fatalf("a front end asking for carol (staff) = %+v, %v", ds, err)
	}
	// A local user's groups are the broker's: a front end cannot add any.
	ds, _ = r.client.Desktops(ctx, fe, brokerapi.DesktopsRequest{User: "bob", Groups: []string{"staff"}})
	if len(ds) != 0 {
		t.Fatalf("a front end gave local user bob the staff group: %+v", ds)
	}
	for _, bad := range []struct {
		cred brokerclient.Credentials
		req  brokerapi.DesktopsRequest
		want int
	}{
		{fe, brokerapi.DesktopsRequest{}, http.StatusBadRequest},
		{alice, brokerapi.DesktopsRequest{User: "bob"}, http.StatusBadRequest},
		{brokerclient.Basic("alice", "wrong"), brokerapi.DesktopsRequest{}, http.StatusUnauthorized},
		{brokerclient.Bearer("not-a-front-end"), brokerapi.DesktopsRequest{User: "alice"}, http.StatusUnauthorized},
	} {
		if _, err := r.client.Desktops(ctx, bad.cred, bad.req); status(err) != bad.want {
			t.Errorf("desktops %+v = %v, want %d", bad.req, err, bad.want)
		}
	}
}

// TestUsersLogOffTheirOwnSessionsOnly: a user (or a front end for them)
// queues a logoff of their own session; another user's session reads as
// none of theirs.
func TestUsersLogOffTheirOwnSessionsOnly(t *testing.T) {
	r := newRig(t, "", nil)
	ctx := context.Background()
	r.agent("h1", "desk", "")
	alice := brokerclient.Basic("alice", "Alice-Pass-1")
	lr, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil {
		t.Fatal(err)
	}
	erin := brokerclient.Basic("erin", "Erin-Pass-1")
	if _, err := r.client.Logoff(ctx, erin, lr.SessionID, brokerapi.DesktopsRequest{}); status(err) != http.StatusNotFound {
		t.Fatalf("erin logged off alice's session: %v", err)
	}
	fe := brokerclient.Bearer("frontend-token")
	if _, err := r.client.Logoff(ctx, fe, lr.SessionID, brokerapi.DesktopsRequest{User: "erin"}); status(err) != http.StatusNotFound {
		t.Fatalf("a front end logged off alice's session for erin: %v", err)
	}
	st, err := r.client.Logoff(ctx, alice, lr.SessionID, brokerapi.DesktopsRequest{})
	if err != nil || st.Kind != "logoff" || st.Host != "h1" || st.User != "alice" || st.State != "pending" {
		t.Fatalf("alice's own logoff = %+v, %v", st, err)
	}
	if _, err := r.client.Logoff(ctx, fe, lr.SessionID, brokerapi.DesktopsRequest{User: "alice"}); err != nil {
		t.Fatalf("a front end's logoff for alice: %v", err)
	}
}
