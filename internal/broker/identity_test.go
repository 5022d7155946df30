package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
)

// TestDesktopAccountIsThePortalUsersSession: alice logs on to her host
// as her desktop account (desk-alice). The host's reports of desk-alice
// are alice's session, the one the broker placed: the portal's list
// shows it active, then disconnected, and alice's logoff reaches the
// host as desk-alice's; no second session appears. A launch that never
// logs on ends after the logon grace and stops counting.
func TestDesktopAccountIsThePortalUsersSession(t *testing.T) {
	r := newRig(t, "", func(c *config.Config) {
		c.Auth.DesktopAccounts = []config.DesktopAccount{{User: "alice", Account: "desk-alice", Password: config.NewSecret("host-pw")}}
		c.Broker.LogonGrace = config.Duration(300 * time.Millisecond)
	})
	ctx := context.Background()
	alice := brokerclient.Basic("alice", "Alice-Pass-1")
	h1 := r.agent("h1", "desk", "")
	lr, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil {
		t.Fatal(err)
	}
	if !lr.SingleSignOn || !strings.Contains(lr.RDP, "username:s:desk-alice") {
		t.Fatalf("launch = single sign-on %v, .rdp file:\n%s", lr.SingleSignOn, lr.RDP)
	}
	state := func() string {
		t.Helper()
		ds, err := r.client.Desktops(ctx, alice, brokerapi.DesktopsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.DeliveryGroup == "desk" && d.Session != nil {
				if d.Session.ID != lr.SessionID {
					t.Fatalf("the portal shows session %s, not the one placed (%s)", d.Session.ID, lr.SessionID)
				}
				return d.Session.State
			}
		}
		return "none"
	}
	if got := state(); got != "launching" {
		t.Fatalf("before logon the portal shows %q", got)
	}
	r.beat("h1", h1, brokerapi.Heartbeat{DiskIdle: 0.9, Sessions: []brokerapi.Session{{User: "desk-alice", State: "active"}}})
	if got := state(); got != "active" {
		t.Fatalf("with desk-alice logged on the portal shows alice's session %q", got)
	}
	if err := r.client.Events(ctx, h1, brokerapi.Events{Host: "h1", Events: []brokerapi.Event{{User: "desk-alice", State: "disconnected"}}}); err != nil {
		t.Fatal(err)
	}
	if got := state(); got != "disconnected" {
		t.Fatalf("after desk-alice's disconnect the portal shows %q", got)
	}
	// Reconnect places alice on her session again.
	again, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil || !again.Reconnect || again.SessionID != lr.SessionID {
		t.Fatalf("reconnect = %+v, %v", again, err)
	}
	if sessions := r.adminList("/api/v1/broker/sessions"); len(sessions) != 1 || sessions[0]["user"] != "alice" {
		t.Fatalf("live sessions = %v; want alice's alone", sessions)
	}
	if _, err := r.client.Logoff(ctx, alice, lr.SessionID, brokerapi.DesktopsRequest{}); err != nil {
		t.Fatal(err)
	}
	cmds, err := r.client.Heartbeat(ctx, h1, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9,
		Sessions: []brokerapi.Session{{User: "desk-alice", State: "disconnected"}}})
	if err != nil || len(cmds) != 1 || cmds[0].Kind != brokerapi.Logoff || cmds[0].User != "desk-alice" {
		t.Fatalf("alice's logoff reached the host as %+v, %v; want a logoff of desk-alice", cmds, err)
	}
	r.beat("h1", h1, brokerapi.Heartbeat{DiskIdle: 0.9})
	if got := state(); got != "none" {
		t.Fatalf("after the logoff the portal shows %q", got)
	}

	// erin launches and never logs on: past the logon grace the launch
	// ends, and neither the sessions nor the host's load count it.
	erin := brokerclient.Basic("erin", "Erin-Pass-1")
	if _, err := r.launch(erin, brokerapi.LaunchRequest{DeliveryGroup: "desk"}); err != nil {
		t.Fatal(err)
	}
	// Waiting for its logon, it is no live session of the console's count.
	rec := r.adminCall("GET", "/api/v1/broker/sessions?limit=1&logged_on=1", "")
	if rec.Code != 200 || rec.Header().Get("Deskway-Total") != "0" {
		t.Fatalf("logged-on sessions with a launch pending: %d, total %q: %s", rec.Code, rec.Header().Get("Deskway-Total"), rec.Body)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r.beat("h1", h1, brokerapi.Heartbeat{DiskIdle: 0.9})
		hosts := r.adminList("/api/v1/broker/hosts")
		if len(r.adminList("/api/v1/broker/sessions")) == 0 && len(hosts) == 1 && hosts[0]["sessions"] == 0.0 && hosts[0]["pending_logons"] == 0.0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a launch that never logged on is still counted: sessions %v, hosts %v", r.adminList("/api/v1/broker/sessions"), hosts)
		}
	}
}
