package bgp

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsPerTenant registers two tenants' metrics in one registry
// (the tenant is a constant label, so they do not collide), refuses a
// tenant registered twice, and leaves nothing behind on unregister.
func TestMetricsPerTenant(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := newMetrics(reg, "acme")
	if err != nil {
		t.Fatal(err)
	}
	b, err := newMetrics(reg, "globex")
	if err != nil {
		t.Fatalf("a second tenant's metrics: %v", err)
	}
	a.announced.Set(1)
	b.announced.Set(2)
	if n := testutil.CollectAndCount(reg, "deskway_site_bgp_prefixes_announced"); n != 2 {
		t.Errorf("%d prefixes_announced series, want one per tenant", n)
	}
	if _, err := newMetrics(reg, "acme"); err == nil {
		t.Error("the same tenant's metrics registered twice")
	}
	if n := testutil.CollectAndCount(reg, "deskway_site_bgp_prefixes_announced"); n != 2 {
		t.Errorf("a refused registration left %d series, want 2", n)
	}
	a.unregister()
	b.unregister()
	if n := testutil.CollectAndCount(reg); n != 0 {
		t.Errorf("%d metrics still registered", n)
	}
}
