package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// snapshot is everything the broker stores, to prove a refused request
// changed nothing.
func (r *rig) snapshot() string {
	r.t.Helper()
	hosts, err := r.store.Hosts(context.Background(), "")
	if err != nil {
		r.t.Fatal(err)
	}
	sessions, err := r.store.Sessions(context.Background(), "", true, 1000)
	if err != nil {
		r.t.Fatal(err)
	}
	for i := range hosts {
		hosts[i].LastSeen = time.Time{} // heartbeats of good requests may move it
	}
	return fmt.Sprintf("%+v\n%+v", hosts, sessions)
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	r := newRig(t, "", nil)
	cred := r.agent("h1", "desk", "")
	r.agent("h2", "desk", "")
	otherKey, _ := auth.NewTokens([]byte("another-key-another-key-another-key!"), nil)
	wrongJoin, _ := otherKey.MintJoin("desk", "", time.Hour, 0)
	expired, _ := r.tokens.MintJoin("desk", "", -time.Minute, 0)
	unknownGroup, _ := r.tokens.MintJoin("nosuch", "", time.Hour, 0)
	gatewayToken, _ := r.tokens.Mint("alice", nil, "h1.lan", 3389, time.Hour)
	basicAlice := "Basic " + basic("alice", "Alice-Pass-1")
	cases := []struct {
		name, path, auth, body string
		status                 int
		want                   string
	}{
		{"malformed JSON", "/api/v1/launch", basicAlice, `{"delivery_group":`, 400, "not the expected JSON"},
		{"oversized body", "/api/v1/launch", basicAlice, `{"delivery_group":"` + strings.Repeat("x", 70000) + `"}`, 400, "over 65536 bytes"},
		{"unknown field", "/api/v1/launch", basicAlice, `{"delivery_group":"desk","priority":1}`, 400, `unknown field "priority"`},
		{"trailing data", "/api/v1/launch", basicAlice, `{"delivery_group":"desk"} {"x":1}`, 400, "data after the JSON object"},
		{"wrong type", "/api/v1/launch", basicAlice, `{"delivery_group":7}`, 400, "not the expected JSON"},
		{"no credentials", "/api/v1/launch", "", `{"delivery_group":"desk"}`, 401, "authenticate with HTTP Basic"},
		{"wrong password", "/api/v1/launch", "Basic " + basic("alice", "nope"), `{"delivery_group":"desk"}`, 401, "wrong user name or password"},
		{"not entitled", "/api/v1/launch", "Basic " + basic("bob", "Bob-Pass-1"), `{"delivery_group":"desk"}`, 403, `bob is not entitled to delivery group "desk"`},
		{"unknown group", "/api/v1/launch", basicAlice, `{"delivery_group":"nosuch"}`, 404, `no delivery group named "nosuch"`},
		{"user acting as front end", "/api/v1/launch", basicAlice, `{"delivery_group":"desk","user":"bob"}`, 400, "user and groups are for front ends"},
		{"front end without user", "/api/v1/launch", "Bearer frontend-token", `{"delivery_group":"desk"}`, 400, "must name the user"},
		{"front end with control characters", "/api/v1/launch", "Bearer frontend-token", `{"delivery_group":"desk","user":"a\r\nfull address:s:evil","groups":["staff"]}`, 400, "control characters"},
		{"unknown bearer", "/api/v1/launch", "Bearer guess", `{"delivery_group":"desk"}`, 401, "not a front-end token"},
		{"gateway token as front-end token", "/api/v1/launch", "Bearer " + gatewayToken, `{"delivery_group":"desk"}`, 401, "not a front-end token"},
		{"register without token", "/api/v1/agent/register", "", `{"name":"h9","address":"h9.lan","port":3389}`, 401, "join token"},
		{"register with wrong join token", "/api/v1/agent/register", "Bearer " + wrongJoin, `{"name":"h9","address":"h9.lan","port":3389}`, 401, "signature is invalid"},
		{"register with expired join token", "/api/v1/agent/register", "Bearer " + expired, `{"name":"h9","address":"h9.lan","port":3389}`, 401, "token is expired"},
		{"register with gateway token", "/api/v1/agent/register", "Bearer " + gatewayToken, `{"name":"h9","address":"h9.lan","port":3389}`, 401, "join token refused"},
		{"register into unknown group", "/api/v1/agent/register", "Bearer " + unknownGroup, `{"name":"h9","address":"h9.lan","port":3389}`, 403, `"nosuch", which this broker does not define`},
		{"register bad name", "/api/v1/agent/register", "Bearer " + mustJoin(r), `{"name":"../h9","address":"h9.lan","port":3389}`, 400, "host name"},
		{"register bad port", "/api/v1/agent/register", "Bearer " + mustJoin(r), `{"name":"h9","address":"h9.lan","port":70000}`, 400, "port 70000"},
		{"register bad address", "/api/v1/agent/register", "Bearer " + mustJoin(r), `{"name":"h9","address":"a b","port":3389}`, 400, "not a host name or IP"},
		{"heartbeat for another host", "/api/v1/agent/heartbeat", "Bearer " + cred, `{"host":"h2","cpu":0.1,"memory":0.1,"disk_idle":0.9}`, 403, `credential is for host "h1", not "h2"`},
		{"heartbeat with join token", "/api/v1/agent/heartbeat", "Bearer " + mustJoin(r), `{"host":"h1","disk_idle":0.9}`, 401, "agent credential refused"},
		{"heartbeat bad fraction", "/api/v1/agent/heartbeat", "Bearer " + cred, `{"host":"h1","cpu":1.5,"disk_idle":0.9}`, 400, "cpu 1.5 is not a fraction"},
		{"heartbeat negative CPU pressure", "/api/v1/agent/heartbeat", "Bearer " + cred, `{"host":"h1","disk_idle":0.9,"cpu_pressure":-0.1}`, 400, "cpu_pressure -0.1 is not a fraction"},
		{"heartbeat CPU pressure above 1", "/api/v1/agent/heartbeat", "Bearer " + cred, `{"host":"h1","disk_idle":0.9,"cpu_pressure":1.5}`, 400, "cpu_pressure 1.5 is not a fraction"},
		{"heartbeat negative swap rate", "/api/v1/agent/heartbeat", "Bearer " + cred, `{"host":"h1","disk_idle":0.9,"swap_out_per_s":-3}`, 400, "swap_out_per_s -3 is not a rate"},
		{"heartbeat negative session CPU", "/api/v1/agent/heartbeat", "Bearer " + cred, `{"host":"h1","disk_idle":0.9,"sessions":[{"user":"x","state":"active","memory_bytes":1,"cpu":-0.5}]}`, 400, `session of "x": cpu -0.5 is not a rate`},
		{"heartbeat session memory below zero", "/api/v1/agent/heartbeat", "Bearer " + cred, `{"host":"h1","disk_idle":0.9,"sessions":[{"user":"x","state":"active","memory_bytes":-1}]}`, 400, "not the expected JSON"},
		{"heartbeat bad session", "/api/v1/agent/heartbeat", "Bearer " + cred, `{"host":"h1","disk_idle":0.9,"sessions":[{"user":"x","state":"launching"}]}`, 400, "state of active or disconnected"},
		{"events for another host", "/api/v1/agent/events", "Bearer " + cred, `{"host":"h2","events":[{"user":"alice","state":"ended"}]}`, 403, "not \"h2\""},
		{"events bad state", "/api/v1/agent/events", "Bearer " + cred, `{"host":"h1","events":[{"user":"alice","state":"gone"}]}`, 400, "state of active, disconnected or ended"},
		{"unknown path", "/api/v1/nothing", basicAlice, `{}`, 404, "no such broker API path"},
	}
	before := r.snapshot()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, r.srv.URL+c.path, strings.NewReader(c.body))
			if c.auth != "" {
				req.Header.Set("Authorization", c.auth)
			}
			resp, err := r.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e brokerapi.Error
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("error body %q is not JSON: %v", body, err)
			}
			if resp.StatusCode != c.status || !strings.Contains(e.Error, c.want) {
				t.Fatalf("got %d %s\nwant %d with %q", resp.StatusCode, body, c.status, c.want)
			}
			if !strings.Contains(r.logs.String(), fmt.Sprintf(`"status":%d`, c.status)) {
				t.Fatalf("refusal with status %d not logged", c.status)
			}
			if after := r.snapshot(); after != before {
				t.Fatalf("a refused request changed the store:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

func mustJoin(r *rig) string {
	tok, err := r.tokens.MintJoin("desk", "", time.Hour, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	return tok
}

func basic(user, pw string) string {
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.SetBasicAuth(user, pw)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}
