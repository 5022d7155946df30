package broker_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
)

// frontEnd is what a portal asks of a broker; Local and the HTTPS
// FrontEnd must both be one.
type frontEnd interface {
	Desktops(context.Context, brokerapi.DesktopsRequest) ([]brokerapi.Desktop, error)
	Launch(context.Context, brokerapi.LaunchRequest) (*brokerapi.LaunchResponse, error)
	Logoff(context.Context, string, brokerapi.DesktopsRequest) (*brokerapi.CommandStatus, error)
}

// TestLocalAnswersAsHTTPS: a portal in the broker's process gets, for
// every call, what a portal over HTTPS with a front-end token gets: the
// same desktops, placements and queued logoffs, and the same refusals
// with the same status and words.
func TestLocalAnswersAsHTTPS(t *testing.T) {
	r := newRig(t, "", nil)
	r.agent("h1", "desk", "")
	ctx := context.Background()
	sides := map[string]frontEnd{
		"https": brokerclient.FrontEnd{Client: r.client, Token: "frontend-token"},
		"local": r.b.Local(0),
	}
	type answer struct {
		status int
		msg    string
	}
	read := func(err error) answer {
		var se *brokerclient.StatusError
		if err == nil {
			return answer{}
		}
		if !errors.As(err, &se) {
			t.Fatalf("a refusal that is not a StatusError: %v", err)
		}
		return answer{se.Status, se.Message}
	}
	carol, err := r.launch(brokerclient.Bearer("frontend-token"), brokerapi.LaunchRequest{DeliveryGroup: "desk", User: "carol", Groups: []string{"bench"}})
	if err != nil {
		t.Fatal(err)
	}
	refusals := map[string]map[string]answer{}
	for name, fe := range sides {
		user := "u-" + name // each side its own user: the other's launch would be a reconnect
		ds, err := fe.Desktops(ctx, brokerapi.DesktopsRequest{User: user, Groups: []string{"bench"}})
		if err != nil || len(ds) != 1 || ds[0].DeliveryGroup != "desk" || ds[0].Session != nil {
			t.Fatalf("%s: desktops before a launch = %+v, %v", name, ds, err)
		}
		res, err := fe.Launch(ctx, brokerapi.LaunchRequest{DeliveryGroup: "desk", User: user, Groups: []string{"bench"}})
		if err != nil || res.Host != "h1" || res.Reconnect || !strings.Contains(res.RDP, "gatewayaccesstoken:s:"+res.Token) {
			t.Fatalf("%s: launch = %+v, %v", name, res, err)
		}
		if c, err := r.tokens.Verify(res.Token); err != nil || c.User() != user {
			t.Fatalf("%s: the token is for %+v (%v), want %s", name, c, err, user)
		}
		ds, err = fe.Desktops(ctx, brokerapi.DesktopsRequest{User: user, Groups: []string{"bench"}})
		if err != nil || ds[0].Session == nil || ds[0].Session.ID != res.SessionID {
			t.Fatalf("%s: desktops after the launch = %+v, %v; want session %s", name, ds, err, res.SessionID)
		}
		st, err := fe.Logoff(ctx, res.SessionID, brokerapi.DesktopsRequest{User: user, Groups: []string{"bench"}})
		if err != nil || st.SessionID != res.SessionID || st.Kind != brokerapi.Logoff || st.State != "pending" {
			t.Fatalf("%s: logoff = %+v, %v", name, st, err)
		}
		got := map[string]answer{}
		_, err = fe.Launch(ctx, brokerapi.LaunchRequest{DeliveryGroup: "desk", User: "bob", Groups: []string{"staff"}})
		got["not entitled"] = read(err)
		_, err = fe.Launch(ctx, brokerapi.LaunchRequest{DeliveryGroup: "nope", User: user})
		got["no such group"] = read(err)
		_, err = fe.Launch(ctx, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
		got["no user named"] = read(err)
		_, err = fe.Desktops(ctx, brokerapi.DesktopsRequest{User: "bad\x01name"})
		got["control character"] = read(err)
		_, err = fe.Logoff(ctx, carol.SessionID, brokerapi.DesktopsRequest{User: "alice"})
		got["another's session"] = read(err)
		refusals[name] = got
	}
	want := map[string]int{"not entitled": http.StatusForbidden, "no such group": http.StatusNotFound, "no user named": http.StatusBadRequest,
		"control character": http.StatusBadRequest, "another's session": http.StatusNotFound}
	for what, status := range want {
		h, l := refusals["https"][what], refusals["local"][what]
		if h.status != status || l != h {
			t.Errorf("%s: over HTTPS %d %q, in process %d %q; want %d from both, in the same words", what, h.status, h.msg, l.status, l.msg, status)
		}
	}
}
