package faults

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// TestSimHostKeepsALogonItsBrokerDiedAnswering is the interleaving the
// broker scenario's kill case lost a launch to: a host reports a user's
// logon to the broker that is then killed, after its database applied
// the event and before it answered. The host's next heartbeat goes to
// the other broker. If it named only the sessions the host had reported
// with an answer (as the simulated host once did), it would tell that
// broker the user's session was gone: the reconcile would end the
// placed record, and the next report of the session would store it as
// one no broker placed, so the launch answered OK would be counted lost.
// The real agent (internal/agent) carries its latest reading in the
// heartbeat whether or not the event report was answered, and so must
// the host the scenario simulates.
func TestSimHostKeepsALogonItsBrokerDiedAnswering(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const user, hostName = "user00001", "vda001"
	// The broker applies the host's event reports and drops each
	// connection without an answer, as a broker killed at that moment
	// does, until it has answered a heartbeat after the first: the host's
	// next request after the kill is its heartbeat.
	k := &killedMidReport{}
	st, srv, tokens := startTestBroker(t, k.wrap)

	lb := newBalancer([]string{srv.URL}, srv.Client().Transport.(*http.Transport).TLSClientConfig)
	join, err := tokens.MintJoin(farmGroup, "", time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := lb.clients[0].Register(ctx, join, brokerapi.RegisterRequest{Name: hostName, Address: hostName + ".faults.test", Port: 3389})
	if err != nil {
		t.Fatal(err)
	}
	h := &simHost{name: hostName, cred: reg.Credential, sessions: map[string]*hostSession{}, posts: map[string][]hostPost{}}
	// A first heartbeat makes the host reachable for placement.
	if _, err := lb.clients[0].Heartbeat(ctx, h.cred, brokerapi.Heartbeat{Host: hostName, DiskIdle: 0.9}); err != nil {
		t.Fatal(err)
	}
	res, _, err := lb.clients[0].Launch(ctx, brokerclient.Bearer(farmFrontend), brokerapi.LaunchRequest{DeliveryGroup: farmGroup, User: user, Groups: []string{farmGroup}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Host != hostName {
		t.Fatalf("placed on %q, want %q", res.Host, hostName)
	}
	h.connect(user, 0)
	done := make(chan struct{})
	go func() { defer close(done); h.run(ctx, lb, 20*time.Millisecond, 50*time.Millisecond) }()
	defer func() { cancel(); <-done }()

	// Wait for the dropped report, then for two heartbeats answered after
	// it: the reconcile of the first heartbeat after the drop is what
	// ended the record, and by the second the host names the user again
	// whatever it does.
	for deadline := time.Now().Add(20 * time.Second); ; {
		if k.dropped.Load() && beatsAfterDrop(h) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the host never reported the logon and two heartbeats after it (dropped %t)", k.dropped.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.mu.Lock()
	posts := slices.Clone(h.posts[user])
	h.mu.Unlock()
	if len(posts) == 0 || posts[0].err == "" {
		t.Fatalf("the logon's report did not fail at the host, so the interleaving was not made: %+v", posts)
	}
	rows, err := st.Sessions(ctx, user, true, 10)
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, s := range rows {
		if s.State == store.Ended {
			t.Errorf("the placed session %s was ended (%+v): the launch answered OK is lost", s.ID, rows)
			continue
		}
		live++
		if s.ID != res.SessionID || s.Unverified || s.Host != hostName || s.State != store.Active {
			t.Errorf("live session %+v, want the placed one %s, verified, active on %s", s, res.SessionID, hostName)
		}
	}
	if live != 1 {
		t.Errorf("%d live sessions of %s, want 1: %+v", live, user, rows)
	}
}

// beatsAfterDrop counts the host's answered heartbeats sent after its
// first failed event report.
func beatsAfterDrop(h *simHost) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var failed time.Time
	for _, ps := range h.posts {
		for _, p := range ps {
			if p.err != "" && (failed.IsZero() || p.at.Before(failed)) {
				failed = p.at
			}
		}
	}
	if failed.IsZero() {
		return 0
	}
	n := 0
	for _, b := range h.beats {
		if b.at.After(failed) && b.err == "" {
			n++
		}
	}
	return n
}

// killedMidReport drops the answer to each event report the broker
// applies until the broker has answered a heartbeat after the first.
type killedMidReport struct {
	dropped, beaten atomic.Bool
}

func (k *killedMidReport) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/api/v1/agent/events" && !k.beaten.Load():
			next.ServeHTTP(httptest.NewRecorder(), r)
			k.dropped.Store(true)
			panic(http.ErrAbortHandler)
		case r.URL.Path == "/api/v1/agent/heartbeat" && k.dropped.Load():
			next.ServeHTTP(w, r)
			k.beaten.Store(true)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// startTestBroker runs the broker role in the test's process on a SQLite
// database, configured as the scenario's brokers are, behind a TLS test
// server serving it through wrap.
func startTestBroker(t *testing.T, wrap func(http.Handler) http.Handler) (*store.Store, *httptest.Server, *auth.Tokens) {
	t.Helper()
	dir := t.TempDir()
	cfg := &config.Config{StateDir: dir, Auth: config.Auth{TokenKey: config.NewSecret(farmTokenKey)},
		Broker: &config.Broker{
			Database:       config.NewDatabaseURL(filepath.Join(dir, "broker.db")),
			Gateway:        "gateway.faults.test:443",
			FrontendTokens: []config.Secret{config.NewSecret(farmFrontend)},
			DeliveryGroups: []config.DeliveryGrp{{Name: farmGroup, Groups: []string{farmGroup}, SessionLimit: 10, LogonLimit: 10}},
		}}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), cfg.Broker.Database.Value(), cfg.Broker.MaxDBConnections)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	users, err := auth.NewUsers(nil)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := auth.NewTokens([]byte(farmTokenKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.New(cfg.Broker, broker.Deps{Logger: slog.New(slog.NewJSONHandler(&testkit.Buffer{}, nil)), Users: users, Tokens: tokens, Store: st, StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(wrap(b.Handler()))
	t.Cleanup(srv.Close)
	return st, srv, tokens
}
