package broker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// TestDatabaseOutageUsesLocalHostCache stops PostgreSQL mid-run: launches
// go on from the broker's local copy (new ones and reconnections), agents'
// reports are accepted, and when PostgreSQL is back every session placed
// meanwhile is in it with the id its launch answered.
func TestDatabaseOutageUsesLocalHostCache(t *testing.T) {
	pg := testkit.StartPostgres(t)
	var stateDir string
	r := newRig(t, pg.NewDB(t), func(c *config.Config) {
		c.Broker.DeliveryGroups[0].LogonLimit = 100
		stateDir = c.StateDir
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	maintain(t, ctx, r.b)
	creds := map[string]string{}
	for _, h := range []string{"h1", "h2", "h3"} {
		creds[h] = r.agent(h, "desk", "")
	}
	fe := brokerclient.Bearer("frontend-token")
	launch := func(user string) *brokerapi.LaunchResponse {
		t.Helper()
		res, err := r.launch(fe, brokerapi.LaunchRequest{DeliveryGroup: "desk", User: user, Groups: []string{"bench"}})
		if err != nil {
			t.Fatalf("launch for %s: %v", user, err)
		}
		return res
	}
	ids := map[string]string{}
	for i := range 10 {
		u := fmt.Sprint("before", i)
		ids[u] = launch(u).SessionID
	}
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		u := fmt.Sprint("during", i)
		res := launch(u)
		if res.Reconnect {
			t.Fatalf("%s reconnected during the outage: %+v", u, res)
		}
		ids[u] = res.SessionID
	}
	// A user with a session from before reconnects to it.
	if res := launch("before3"); !res.Reconnect || res.SessionID != ids["before3"] {
		t.Fatalf("relaunch during the outage = %+v, want session %s", res, ids["before3"])
	}
	if got := testutil.ToFloat64(mustCounter(t, r.reg, "deskway_broker_launches_total", "result", "placed_offline")); got != 10 {
		t.Fatalf("placed_offline = %v, want 10", got)
	}
	// Agents keep reporting; the broker takes their reports, and the
	// admin API shows them from the local copy.
	r.beat("h1", creds["h1"], brokerapi.Heartbeat{DiskIdle: 0.9, SwapOutPerSec: 7, CPUPressure: 0.35})
	shown, pressure := map[string]any{}, map[string]any{}
	for _, h := range r.adminList("/api/v1/broker/hosts") {
		shown[h["name"].(string)] = h["swap_out_per_s"]
		pressure[h["name"].(string)] = h["cpu_pressure"]
	}
	if shown["h1"] != 7.0 {
		t.Fatalf("swap out per second of the hosts in the admin API during the outage = %v, want 7 on h1", shown)
	}
	if pressure["h1"] != 0.35 {
		t.Fatalf("CPU pressure of the hosts in the admin API during the outage = %v, want 0.35 on h1", pressure)
	}
	if err := r.client.Events(context.Background(), creds["h1"], brokerapi.Events{Host: "h1", Events: []brokerapi.Event{{User: "during0", State: "active"}}}); err != nil {
		t.Fatalf("event during the outage: %v", err)
	}
	journal := filepath.Join(stateDir, "broker-offline.journal")
	if st, err := os.Stat(journal); err != nil || st.Size() == 0 {
		t.Fatalf("no journal of offline launches: %v", err)
	}
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Back online is what the broker says on /metrics: the write-back
	// removes the journal a moment before the broker goes back to the
	// database, and a launch in between is placed from the cache again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		live, err := r.store.Sessions(context.Background(), "", false, 100)
		if err == nil && len(live) == 20 && gaugeValue(t, r.reg, "deskway_broker_database_unreachable") == 0 {
			for _, s := range live {
				if ids[s.User] != s.ID {
					t.Fatalf("session of %s in the database is %s, the launch answered %s", s.User, s.ID, ids[s.User])
				}
			}
			break
		}
		if time.Now().After(deadline) {
			all, _ := r.store.Sessions(context.Background(), "", true, 100)
			t.Fatalf("after the database returned: %d live sessions (%v), want 20 and the broker back on the database\nall: %+v\nlog:\n%s", len(live), err, all, r.logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	hosts, err := r.store.Hosts(context.Background(), "desk")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, h := range hosts {
		total += h.Sessions
	}
	if total != 20 {
		t.Fatalf("host counters sum to %d sessions, want 20", total)
	}
	if _, err := os.Stat(journal); !os.IsNotExist(err) {
		t.Fatalf("journal still there after write-back: %v", err)
	}
	if res := launch("after"); res.Reconnect {
		t.Fatalf("launch after recovery: %+v", res)
	}
	if got := testutil.ToFloat64(mustCounter(t, r.reg, "deskway_broker_launches_total", "result", "placed")); got != 11 {
		t.Fatalf("placed in the database = %v, want 11 (10 before, 1 after)", got)
	}
}
