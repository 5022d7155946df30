package agent_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/agent"
	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
)

const key = "agent-test-token-key-0123456789abcdef0"

// TestAgentAgainstBroker runs the agent loop against a real broker:
// registration, heartbeats with this machine's /proc counters and the
// sessions' memory and CPU, session events as the host's sessions change,
// and drain through the drain file.
func TestAgentAgainstBroker(t *testing.T) {
	dir := t.TempDir()
	// The counters are this machine's, busy running the tests: its tasks
	// waiting for a CPU or its disk must not turn the launch away.
	st, srv, tokens := startBroker(t, filepath.Join(dir, "b.db"), 200*time.Millisecond, []string{"ann"},
		config.Health{CPUPressureMaxPct: 100, DiskIdleMinPct: 0, DiskLatencyMaxMS: 100000, MemoryPressureMaxPct: 20})
	join, _ := tokens.MintJoin("desk", "lab", time.Hour, 0)
	var mu sync.Mutex
	sessions := []brokerapi.Session{}
	set := func(ss ...brokerapi.Session) { mu.Lock(); sessions = ss; mu.Unlock() }
	// ann's session holds 300 MiB and uses a fifth of a core: 20 ticks a
	// second, counted from the first reading.
	start := time.Now()
	usage := func() ([]agent.SessionUsage, error) {
		ticks := uint64(time.Since(start).Seconds()*20) + 5000
		return []agent.SessionUsage{{User: "ann", Display: "10", PSSBytes: 300 << 20, CPUTicks: ticks, Processes: 4}}, nil
	}
	drain := filepath.Join(dir, "drain")
	acfg := &config.Agent{Broker: srv.URL, JoinToken: config.NewSecret(join), Name: "host-a", Address: "10.0.0.5",
		Port: 3389, Sessions: "none", SessionPoll: config.Duration(50 * time.Millisecond), DrainFile: drain}
	runAgent(t, srv, acfg, agent.Deps{Sessions: func() ([]brokerapi.Session, error) {
		mu.Lock()
		defer mu.Unlock()
		return append([]brokerapi.Session(nil), sessions...), nil
	}, Usage: usage})
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	host := func() store.Host {
		hs, _ := st.Hosts(context.Background(), "desk")
		for _, h := range hs {
			if h.Name == "host-a" {
				return h
			}
		}
		return store.Host{}
	}
	waitFor("registration", func() bool { return host().Address == "10.0.0.5" })
	if h := host(); h.Zone != "lab" || h.Group != "desk" || h.Port != 3389 {
		t.Fatalf("registered host = %+v", h)
	}
	waitFor("a heartbeat with memory use", func() bool { return host().Mem > 0 })
	// A launch, then the user appears on the host: the logon is reported.
	l := store.Launch{User: "ann", Group: "desk", SessionID: store.NewID(), Now: time.Now(), Stale: time.Now().Add(-time.Minute)}
	if _, err := st.Place(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	state := func() string {
		ss, _ := st.Sessions(context.Background(), "ann", true, 1)
		if len(ss) == 0 {
			return ""
		}
		return ss[0].State
	}
	set(brokerapi.Session{User: "ann", State: "active"})
	waitFor("logon", func() bool { return state() == store.Active })
	// The heartbeats carry what the session uses: its memory, and once
	// two readings are apart, its CPU.
	var ann store.Session
	waitFor("the session's usage", func() bool {
		ss, _ := st.Sessions(context.Background(), "ann", false, 1)
		if len(ss) == 1 {
			ann = ss[0]
		}
		return ann.Memory > 0 && ann.CPU > 0
	})
	if ann.Memory != 300<<20 || ann.CPU < 0.1 || ann.CPU > 0.3 {
		t.Fatalf("ann's session as stored = %+v, want 300 MiB and about 0.2 of a core", ann)
	}
	if h := host(); h.SessionMemory != 300<<20 {
		t.Fatalf("host's memory per session = %d, want %d", h.SessionMemory, 300<<20)
	}
	set(brokerapi.Session{User: "ann", State: "disconnected"})
	waitFor("disconnect", func() bool { return state() == store.Disconnected })
	set()
	waitFor("logoff", func() bool { return state() == store.Ended })
	if err := os.WriteFile(drain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor("drain", func() bool { return host().AgentDrain })
	os.Remove(drain)
	waitFor("undrain", func() bool { return !host().AgentDrain })
}

// startBroker runs a broker on database (a SQLite file or a PostgreSQL
// URL) with the delivery group desk for users, behind an HTTPS test
// server; all stop when the test ends.
func startBroker(t *testing.T, database string, beat time.Duration, users []string, health config.Health) (*store.Store, *httptest.Server, *auth.Tokens) {
	t.Helper()
	dir := t.TempDir()
	cfg := &config.Config{StateDir: dir, Auth: config.Auth{TokenKey: config.NewSecret(key)},
		Broker: &config.Broker{Database: config.NewDatabaseURL(database), Gateway: "gw:443", HeartbeatInterval: config.Duration(beat),
			DeliveryGroups: []config.DeliveryGrp{{Name: "desk", Users: users}}, Health: health}}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), database, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tokens, _ := auth.NewTokens([]byte(key), nil)
	accounts, _ := auth.NewUsers(nil)
	b, err := broker.New(cfg.Broker, broker.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Users: accounts,
		Tokens: tokens, Store: st, StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(b.Handler())
	t.Cleanup(srv.Close)
	return st, srv, tokens
}

// runAgent runs an agent of cfg against srv, with d's session readers,
// until the test ends; the agent must then stop without an error.
func runAgent(t *testing.T, srv *httptest.Server, cfg *config.Agent, d agent.Deps) {
	t.Helper()
	d.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	d.Client = &brokerclient.Client{Base: srv.URL, HTTP: srv.Client()}
	a, err := agent.New(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
}
