package broker_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// restartedBroker is a broker started again on cfg's state directory, as
// after a crash or an upgrade, with a store that has not yet spoken to
// the database.
type restartedBroker struct {
	b      *broker.Server
	client *brokerclient.Client
	logs   *testkit.Buffer
}

func restartBroker(t *testing.T, cfg *config.Config) *restartedBroker {
	t.Helper()
	st, err := store.Connect(cfg.Broker.Database.Value(), cfg.Broker.MaxDBConnections)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	users, err := auth.NewUsers(cfg.Auth.Users)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := auth.NewTokens([]byte(key), nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.Buffer{}
	b, err := broker.New(cfg.Broker, broker.Deps{Logger: slog.New(slog.NewJSONHandler(logs, nil)), Registry: prometheus.NewRegistry(),
		Users: users, Tokens: tokens, Store: st, StateDir: cfg.StateDir})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatalf("a broker restarted while the database is down did not start: %v", err)
	}
	srv := httptest.NewTLSServer(b.Handler())
	t.Cleanup(srv.Close)
	return &restartedBroker{b: b, logs: logs, client: &brokerclient.Client{Base: srv.URL, HTTP: srv.Client(), MaxRetries: 50}}
}

// TestBrokerStartsDuringAnOutage: PostgreSQL stops and the broker
// restarts. It starts from the local host cache it saved, launches and
// reconnections go on (across a second restart too), and when PostgreSQL
// is back the database gets its migrations, its groups and every session
// placed meanwhile.
func TestBrokerStartsDuringAnOutage(t *testing.T) {
	pg := testkit.StartPostgres(t)
	var cfg *config.Config
	r := newRig(t, pg.NewDB(t), func(c *config.Config) { cfg = c })
	ctx, stop := context.WithCancel(context.Background())
	maintain(t, ctx, r.b)
	cred := r.agent("h1", "desk", "")
	r.beat("h1", cred, brokerapi.Heartbeat{DiskIdle: 0.9, CPUPressure: 0.3})
	fe := brokerclient.Bearer("frontend-token")
	launch := func(c *brokerclient.Client, user string) *brokerapi.LaunchResponse {
		t.Helper()
		res, _, err := c.Launch(context.Background(), fe, brokerapi.LaunchRequest{DeliveryGroup: "desk", User: user, Groups: []string{"bench"}})
		if err != nil {
			t.Fatalf("launch for %s: %v", user, err)
		}
		return res
	}
	first := launch(r.client, "u1")
	// The broker saves its cache as it refreshes it (every 5 s).
	saved := filepath.Join(cfg.StateDir, "broker-cache.json")
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if b, _ := os.ReadFile(saved); strings.Contains(string(b), first.SessionID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the local host cache was not saved with u1's session\n%s", r.logs.String())
		}
	}
	stop()
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}

	b2 := restartBroker(t, cfg)
	if !strings.Contains(b2.logs.String(), "database unreachable at start") {
		t.Fatalf("the outage start is not logged:\n%s", b2.logs.String())
	}
	// The saved cache kept what h1 last reported.
	rec := httptest.NewRecorder()
	b2.b.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/api/v1/broker/hosts", nil))
	if !strings.Contains(rec.Body.String(), `"cpu_pressure":0.3`) {
		t.Fatalf("hosts from the saved cache = %s, want h1's cpu_pressure 0.3", rec.Body.String())
	}
	if _, err := b2.client.Heartbeat(context.Background(), cred, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9}); err != nil {
		t.Fatalf("heartbeat during the outage: %v", err)
	}
	if again := launch(b2.client, "u1"); !again.Reconnect || again.SessionID != first.SessionID {
		t.Fatalf("u1 relaunched during the outage = %+v, want a reconnect to %s", again, first.SessionID)
	}
	u2 := launch(b2.client, "u2")
	if u2.Reconnect {
		t.Fatalf("u2's first launch is a reconnect: %+v", u2)
	}
	// The admin API answers from the cache, and says so.
	for path, want := range map[string]string{"/api/v1/broker/hosts": `"name":"h1"`, "/api/v1/broker/sessions?user=u1": first.SessionID} {
		rec := httptest.NewRecorder()
		b2.b.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 200 || rec.Header().Get("Deskway-Source") != "local-host-cache" || !strings.Contains(rec.Body.String(), want) {
			t.Fatalf("GET %s during the outage: %d %v %s", path, rec.Code, rec.Header(), rec.Body.String())
		}
	}

	// Restarted once more, still without a database: u2's offline session
	// is known from the journal.
	b3 := restartBroker(t, cfg)
	if again := launch(b3.client, "u2"); !again.Reconnect || again.SessionID != u2.SessionID {
		t.Fatalf("u2 relaunched after a second restart = %+v, want a reconnect to %s", again, u2.SessionID)
	}
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx3, stop3 := context.WithCancel(context.Background())
	defer stop3()
	go b3.b.Maintain(ctx3)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		live, err := r.store.Sessions(context.Background(), "", false, 100)
		ids := map[string]string{}
		for _, s := range live {
			ids[s.User] = s.ID
		}
		// The sessions are written back before the broker goes online and
		// says so: wait for both.
		back := strings.Contains(b3.logs.String(), "database reachable again")
		if err == nil && len(live) == 2 && ids["u1"] == first.SessionID && ids["u2"] == u2.SessionID && back {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the database returned: live sessions %v (%v), want u1 %s and u2 %s; return logged: %v\n%s", ids, err, first.SessionID, u2.SessionID, back, b3.logs.String())
		}
	}
	if again := launch(b3.client, "u2"); !again.Reconnect || again.SessionID != u2.SessionID {
		t.Fatalf("u2 relaunched after the database returned = %+v, want a reconnect to %s", again, u2.SessionID)
	}
}
