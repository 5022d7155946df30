package agent_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/agent"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// TestAgentReadsSessionsWhileTheBrokerStalls: the broker's PostgreSQL
// holds its sessions table locked for 4 s (as a maintenance statement
// does), so a report waits there 3 s before the broker refuses it. Bob
// logs on first, and his report waits; meanwhile ann, whom the broker
// had placed, logs on and off again within 1.5 s. The agent saw that
// session and reported its logon and logoff once the report before
// was answered, so the broker ends ann's launch. An agent that read no
// sessions while its report waited (as before) never saw ann, and the
// broker held her launch as logging on until broker.logon_grace.
func TestAgentReadsSessionsWhileTheBrokerStalls(t *testing.T) {
	dsn := testkit.StartPostgres(t).NewDB(t)
	st, srv, tokens := startBroker(t, dsn, time.Second, []string{"ann", "bob"},
		config.Health{CPUPressureMaxPct: 100, DiskIdleMinPct: 0, DiskLatencyMaxMS: 100000, MemoryPressureMaxPct: 100})
	join, _ := tokens.MintJoin("desk", "", time.Hour, 0)
	var mu sync.Mutex
	var sessions []brokerapi.Session
	set := func(ss ...brokerapi.Session) { mu.Lock(); sessions = ss; mu.Unlock() }
	acfg := &config.Agent{Broker: srv.URL, JoinToken: config.NewSecret(join), Name: "host-a", Address: "10.0.0.5",
		Port: 3389, Sessions: "none", SessionPoll: config.Duration(100 * time.Millisecond)}
	runAgent(t, srv, acfg, agent.Deps{Sessions: func() ([]brokerapi.Session, error) {
		mu.Lock()
		defer mu.Unlock()
		return append([]brokerapi.Session(nil), sessions...), nil
	}})
	ctx := context.Background()
	state := func(user string) string {
		ss, _ := st.Sessions(ctx, user, true, 1)
		if len(ss) == 0 {
			return ""
		}
		return ss[0].State
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if hs, _ := st.Hosts(ctx, "desk"); len(hs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent did not register within 10 s")
		}
	}
	for _, u := range []string{"ann", "bob"} {
		l := store.Launch{User: u, Group: "desk", SessionID: store.NewID(), Now: time.Now(), Stale: time.Now().Add(-time.Minute)}
		if _, err := st.Place(ctx, l); err != nil {
			t.Fatal(err)
		}
	}

	release := testkit.LockTable(t, dsn, "sessions", "EXCLUSIVE")
	time.AfterFunc(4*time.Second, release)
	bob := brokerapi.Session{User: "bob", State: store.Active}
	set(bob)
	time.Sleep(500 * time.Millisecond) // bob's report waits on the lock
	set(bob, brokerapi.Session{User: "ann", State: store.Active})
	time.Sleep(time.Second)
	set(bob)

	for deadline := time.Now().Add(15 * time.Second); state("ann") != store.Ended || state("bob") != store.Active; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("15 s after ann logged on and off during the stall, the broker holds ann %q and bob %q, want ended and active",
				state("ann"), state("bob"))
		}
	}
}
