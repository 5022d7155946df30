package broker_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// withLab adds a second delivery group, lab, that desk users are not in.
func withLab(c *config.Config) {
	c.Broker.DeliveryGroups = append(c.Broker.DeliveryGroups, config.DeliveryGrp{Name: "lab", Groups: []string{"contractors"}})
}

func (r *rig) register(token string, req brokerapi.RegisterRequest) (*brokerapi.RegisterResponse, error) {
	if req.Port == 0 {
		req.Port = 3389
	}
	return r.client.Register(context.Background(), token, req)
}

// TestJoinTokenCannotTakeOverAHost: a join token registers new hosts in
// its own group only; re-registering a name needs that host's own
// credential, so no token can move a host or redirect its users.
func TestJoinTokenCannotTakeOverAHost(t *testing.T) {
	r := newRig(t, "", withLab)
	cred := r.agent("desk-01", "desk", "")
	alice := brokerclient.Basic("alice", "Alice-Pass-1")
	first, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil || first.Address != "desk-01.lan" {
		t.Fatalf("launch: %+v %v", first, err)
	}
	labJoin, _ := r.tokens.MintJoin("lab", "", time.Hour, 0)
	deskJoin, _ := r.tokens.MintJoin("desk", "", time.Hour, 0)
	for name, tok := range map[string]string{"lab join token": labJoin, "desk join token": deskJoin} {
		_, err := r.register(tok, brokerapi.RegisterRequest{Name: "desk-01", Address: "attacker.example.test"})
		if status(err) != http.StatusConflict || !strings.Contains(err.Error(), "already registered") {
			t.Fatalf("%s re-registering desk-01: %v, want 409 already registered", name, err)
		}
	}
	hosts, err := r.store.Hosts(context.Background(), "")
	if err != nil || len(hosts) != 1 || hosts[0].Group != "desk" || hosts[0].Address != "desk-01.lan" {
		t.Fatalf("hosts after the attempts: %+v %v", hosts, err)
	}
	again, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil || !again.Reconnect || again.Address != "desk-01.lan" {
		t.Fatalf("alice's reconnect went to %+v (%v)", again, err)
	}
	// The host's own credential may update it, and only it.
	if _, err := r.register(cred, brokerapi.RegisterRequest{Name: "desk-01", Address: "desk-01b.lan"}); err != nil {
		t.Fatalf("desk-01 re-registering with its credential: %v", err)
	}
	if _, err := r.register(cred, brokerapi.RegisterRequest{Name: "desk-02", Address: "x.lan"}); status(err) != http.StatusForbidden {
		t.Fatalf("desk-01's credential registering desk-02: %v, want 403", err)
	}
	// An administrator frees a name (a host with live sessions stays).
	del := func(name string) int {
		rec := httptest.NewRecorder()
		r.admin.ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, "/api/v1/broker/hosts/"+name, nil))
		return rec.Code
	}
	if code := del("desk-01"); code != http.StatusConflict {
		t.Fatalf("removing a host with a live session: %d", code)
	}
	r.agent("spare-01", "desk", "")
	if code := del("spare-01"); code != http.StatusNoContent {
		t.Fatalf("removing a host: %d", code)
	}
	if _, err := r.register(labJoin, brokerapi.RegisterRequest{Name: "spare-01", Address: "spare.lan"}); err != nil {
		t.Fatalf("joining a removed host's name: %v", err)
	}
}

// TestJoinTokenUsesHoldAcrossBrokers: a token for three hosts registers
// three, however many brokers sharing PostgreSQL are asked at once.
func TestJoinTokenUsesHoldAcrossBrokers(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	a, b := newRig(t, dsn, nil), newRig(t, dsn, nil)
	tok, _ := a.tokens.MintJoin("desk", "", time.Hour, 3)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, used := 0, 0
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := a
			if i%2 == 1 {
				r = b
			}
			_, err := r.register(tok, brokerapi.RegisterRequest{Name: fmt.Sprintf("h%d", i), Address: fmt.Sprintf("h%d.lan", i)})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case status(err) == http.StatusUnauthorized && strings.Contains(err.Error(), "registered the 3 hosts it may"):
				used++
			default:
				t.Errorf("registration %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if ok != 3 || used != 9 {
		t.Fatalf("%d registrations succeeded and %d were told the token is used up; want 3 and 9", ok, used)
	}
}
