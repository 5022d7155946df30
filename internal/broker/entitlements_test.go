package broker_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// admin sends method path with body to the broker's admin API.
func (r *rig) adminCall(method, path, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	r.admin.ServeHTTP(rec, req)
	return rec
}

// TestAdminSetsEntitlements: an administrator replaces who may launch a
// delivery group through the admin API; launches follow at once, on this
// broker and on another sharing the database, and clearing it brings the
// configured entitlement back. Bad requests are refused with what to fix.
func TestAdminSetsEntitlements(t *testing.T) {
	// Brokers share PostgreSQL: a SQLite file is one broker's alone.
	dsn := testkit.StartPostgres(t).NewDB(t)
	r := newRig(t, dsn, nil)
	r.agent("h1", "desk", "")
	alice := brokerclient.Basic("alice", "Alice-Pass-1") // staff: configured for desk
	bob := brokerclient.Basic("bob", "Bob-Pass-1")       // contractors: not
	desk := brokerapi.LaunchRequest{DeliveryGroup: "desk"}
	if _, err := r.launch(bob, desk); status(err) != http.StatusForbidden {
		t.Fatalf("bob before the change: %v, want 403", err)
	}
	rec := r.adminCall("PUT", "/api/v1/broker/groups/desk/entitlements", `{"users":[" erin ","ERIN"],"groups":["contractors"]}`)
	var g brokerapi.DeliveryGroup
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &g) != nil {
		t.Fatalf("PUT entitlements: %d %s", rec.Code, rec.Body.String())
	}
	if g.EntitlementsFrom != "admin" || strings.Join(g.Users, ",") != "erin" || strings.Join(g.Groups, ",") != "contractors" ||
		strings.Join(g.ConfiguredGroups, ",") != "staff,bench" || g.SetAt == nil || g.SetBy == "" {
		t.Fatalf("the group after PUT: %+v", g)
	}
	if _, err := r.launch(bob, desk); err != nil {
		t.Fatalf("bob (contractors) after the change: %v", err)
	}
	if _, err := r.launch(alice, desk); status(err) != http.StatusForbidden {
		t.Fatalf("alice (staff) after staff lost desk: %v, want 403", err)
	}
	if !strings.Contains(r.logs.String(), "delivery group entitlements set") {
		t.Fatalf("the change is not logged:\n%s", r.logs.String())
	}

	// A second broker on the same database follows the change.
	r2 := newRig(t, dsn, nil)
	if _, err := r2.launch(brokerclient.Basic("erin", "Erin-Pass-1"), desk); err != nil {
		t.Fatalf("erin on a second broker: %v", err)
	}
	if _, err := r2.launch(alice, desk); status(err) != http.StatusForbidden {
		t.Fatalf("alice on a second broker: %v, want 403", err)
	}

	for _, c := range []struct{ path, body, want string }{
		{"/api/v1/broker/groups/nope/entitlements", `{"groups":["staff"]}`, "no delivery group"},
		{"/api/v1/broker/groups/desk/entitlements", `{"users":[],"groups":[]}`, "nobody could launch"},
		{"/api/v1/broker/groups/desk/entitlements", `{"users":["a\u0007b"]}`, "control character"},
		{"/api/v1/broker/groups/desk/entitlements", `{"users":[""]}`, "empty name"},
		{"/api/v1/broker/groups/desk/entitlements", `{"users":["` + strings.Repeat("x", 257) + `"]}`, "over 256 bytes"},
		{"/api/v1/broker/groups/desk/entitlements", `{"user":["alice"]}`, "unknown field"},
	} {
		rec := r.adminCall("PUT", c.path, c.body)
		if rec.Code < 400 || !strings.Contains(rec.Body.String(), c.want) {
			t.Errorf("PUT %s %s: %d %s, want a refusal saying %q", c.path, c.body, rec.Code, rec.Body.String(), c.want)
		}
	}
	if _, err := r.launch(bob, desk); err != nil {
		t.Fatalf("a refused change changed the entitlement: bob %v", err)
	}

	rec = r.adminCall("DELETE", "/api/v1/broker/groups/desk/entitlements", "")
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &g) != nil || g.EntitlementsFrom != "configuration" || strings.Join(g.Groups, ",") != "staff,bench" {
		t.Fatalf("DELETE entitlements: %d %s", rec.Code, rec.Body.String())
	}
	if _, err := r.launch(alice, desk); err != nil {
		t.Fatalf("alice after the configured entitlement is back: %v", err)
	}
	if _, err := r.launch(brokerclient.Basic("erin", "Erin-Pass-1"), desk); err != nil {
		t.Fatalf("erin (staff) after the configured entitlement is back: %v", err)
	}
	// bob's session stays, but he may not launch again.
	if _, err := r.launch(bob, desk); status(err) != http.StatusForbidden {
		t.Fatalf("bob after the clear: %v, want 403", err)
	}
}

// TestEntitlementsSurviveARestartInAnOutage: an entitlement an
// administrator narrowed stays narrow when the broker restarts while the
// database is down: the saved local host cache keeps it, so a user whose
// desktop was taken away does not get it back from the configuration.
func TestEntitlementsSurviveARestartInAnOutage(t *testing.T) {
	pg := testkit.StartPostgres(t)
	var cfg *config.Config
	r := newRig(t, pg.NewDB(t), func(c *config.Config) { cfg = c })
	r.agent("h1", "desk", "")
	if rec := r.adminCall("PUT", "/api/v1/broker/groups/desk/entitlements", `{"groups":["contractors"]}`); rec.Code != http.StatusOK {
		t.Fatalf("PUT entitlements: %d %s", rec.Code, rec.Body.String())
	}
	ctx, stop := context.WithCancel(context.Background())
	maintain(t, ctx, r.b)
	saved := filepath.Join(cfg.StateDir, "broker-cache.json")
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if b, _ := os.ReadFile(saved); strings.Contains(string(b), `"contractors"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the local host cache was not saved with the entitlement\n%s", r.logs.String())
		}
	}
	stop()
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	b2 := restartBroker(t, cfg)
	if _, _, err := b2.client.Launch(context.Background(), brokerclient.Basic("alice", "Alice-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"}); status(err) != http.StatusForbidden {
		t.Fatalf("alice (staff, removed by an administrator) after a restart in the outage: %v, want 403", err)
	}
	if _, _, err := b2.client.Launch(context.Background(), brokerclient.Basic("bob", "Bob-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"}); err != nil {
		t.Fatalf("bob (contractors) after a restart in the outage: %v", err)
	}
}
