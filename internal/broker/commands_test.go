package broker_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/testkit"
)

// adminDo calls the admin API and decodes a JSON answer into out.
func (r *rig) adminDo(method, path, body string, out any) int {
	r.t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	r.admin.ServeHTTP(rec, req)
	if out != nil && rec.Code < 300 {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			r.t.Fatalf("%s %s: %v: %s", method, path, err, rec.Body)
		}
	}
	return rec.Code
}

// TestSessionCommandsReachTheHostsAgent: an administrator's logoff and
// message, queued on one broker, reach the session's host through its
// heartbeat to another broker sharing PostgreSQL, once; only that host
// may answer, once; bad requests are refused with what to fix.
func TestSessionCommandsReachTheHostsAgent(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	a, b := newRig(t, dsn, nil), newRig(t, dsn, nil)
	ctx := context.Background()
	h1 := a.agent("h1", "desk", "")
	lr, err := a.launch(brokerclient.Basic("alice", "Alice-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil {
		t.Fatal(err)
	}
	h2 := a.agent("h2", "desk", "")
	base := "/api/v1/broker/sessions/" + lr.SessionID
	for _, bad := range []struct {
		path, body string
		want       int
	}{
		{base + "/message", `{}`, http.StatusBadRequest},
		{base + "/message", `{"text":"   "}`, http.StatusBadRequest},
		{base + "/message", `{"text":"line\u001b[2Jclear"}`, http.StatusBadRequest},
		{base + "/message", `{"text":"` + strings.Repeat("x", 1001) + `"}`, http.StatusBadRequest},
		{base + "/logoff", `{"text":"bye"}`, http.StatusBadRequest},
		{base + "/reboot", ``, http.StatusNotFound},
		{"/api/v1/broker/sessions/no-such-session/logoff", ``, http.StatusNotFound},
	} {
		if code := a.adminDo("POST", bad.path, bad.body, nil); code != bad.want {
			t.Errorf("POST %s %s = %d, want %d", bad.path, bad.body, code, bad.want)
		}
	}
	var msg brokerapi.CommandStatus
	if code := a.adminDo("POST", base+"/message", `{"text":"Maintenance at 18:00.\nSave your work."}`, &msg); code != http.StatusAccepted {
		t.Fatalf("message: %d", code)
	}
	if msg.Host != "h1" || msg.User != "alice" || msg.State != "pending" {
		t.Fatalf("queued message = %+v", msg)
	}
	var off brokerapi.CommandStatus
	if code := a.adminDo("POST", base+"/logoff", ``, &off); code != http.StatusAccepted {
		t.Fatalf("logoff: %d", code)
	}
	if cmds, err := b.client.Heartbeat(ctx, h2, brokerapi.Heartbeat{Host: "h2", DiskIdle: 0.9}); err != nil || len(cmds) != 0 {
		t.Fatalf("h2's heartbeat took h1's commands: %+v %v", cmds, err)
	}
	cmds, err := b.client.Heartbeat(ctx, h1, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9,
		Sessions: []brokerapi.Session{{User: "alice", State: "active"}}})
	if err != nil || len(cmds) != 2 {
		t.Fatalf("h1's heartbeat brought %+v, %v; want the message and the logoff", cmds, err)
	}
	kinds := map[string]brokerapi.Command{}
	for _, c := range cmds {
		kinds[c.Kind] = c
	}
	if m := kinds["message"]; m.ID != msg.ID || m.Text != "Maintenance at 18:00.\nSave your work." || m.User != "alice" || m.SessionID != lr.SessionID {
		t.Fatalf("message command = %+v", m)
	}
	if again, _ := b.client.Heartbeat(ctx, h1, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9,
		Sessions: []brokerapi.Session{{User: "alice", State: "active"}}}); len(again) != 0 {
		t.Fatalf("commands handed out twice: %+v", again)
	}
	var st brokerapi.CommandStatus
	a.adminDo("GET", "/api/v1/broker/commands/"+msg.ID, "", &st)
	if st.State != "sent" {
		t.Fatalf("a taken command reads %+v", st)
	}
	// Only h1 answers h1's commands.
	if err := b.client.CommandResult(ctx, h2, msg.ID, brokerapi.CommandResult{Host: "h1"}); status(err) != http.StatusForbidden {
		t.Fatalf("h2's credential answered for h1: %v", err)
	}
	if err := b.client.CommandResult(ctx, h2, msg.ID, brokerapi.CommandResult{Host: "h2"}); status(err) != http.StatusNotFound {
		t.Fatalf("h2 answered h1's command: %v", err)
	}
	if err := b.client.CommandResult(ctx, h1, msg.ID, brokerapi.CommandResult{Host: "h1"}); err != nil {
		t.Fatal(err)
	}
	if err := b.client.CommandResult(ctx, h1, msg.ID, brokerapi.CommandResult{Host: "h1", Error: "changed my mind"}); status(err) != http.StatusNotFound {
		t.Fatalf("a command was answered twice: %v", err)
	}
	if err := b.client.CommandResult(ctx, h1, off.ID, brokerapi.CommandResult{Host: "h1", Error: "user \"alice\" has no xrdp session on this host"}); err != nil {
		t.Fatal(err)
	}
	a.adminDo("GET", "/api/v1/broker/commands/"+msg.ID, "", &st)
	if st.State != "done" || st.Error != "" {
		t.Fatalf("answered message = %+v", st)
	}
	a.adminDo("GET", "/api/v1/broker/commands/"+off.ID, "", &st)
	if st.State != "failed" || !strings.Contains(st.Error, "no xrdp session") {
		t.Fatalf("failed logoff = %+v", st)
	}
	// The session ends: commands for it are refused.
	if err := b.client.Events(ctx, h1, brokerapi.Events{Host: "h1", Events: []brokerapi.Event{{User: "alice", State: "ended"}}}); err != nil {
		t.Fatal(err)
	}
	if code := a.adminDo("POST", base+"/disconnect", ``, nil); code != http.StatusConflict {
		t.Fatalf("disconnect of an ended session = %d, want 409", code)
	}
	if code := a.adminDo("GET", "/api/v1/broker/commands/nope", "", nil); code != http.StatusNotFound {
		t.Fatalf("unknown command = %d", code)
	}
}
