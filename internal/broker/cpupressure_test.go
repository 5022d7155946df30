package broker_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
)

// TestUnhealthyCPUPressure: a host whose runnable tasks wait for a CPU
// more than the threshold's share of the time is unhealthy, and the
// reason says so; at or under it, CPU pressure says nothing.
func TestUnhealthyCPUPressure(t *testing.T) {
	h := config.Health{DiskIdleMinPct: 50, DiskLatencyMaxMS: 25, MemoryPressureMaxPct: 20, CPUPressureMaxPct: 60}
	for _, c := range []struct {
		cpu, mem float64
		want     string
	}{
		{0, 0, ""},
		{0.59, 0, ""},
		{0.60, 0, ""}, // at the threshold, not over it
		{0.61, 0, "cpu pressure 61% > 60%"},
		{0.9, 0, "cpu pressure 90% > 60%"},
		{0.9, 0.3, "memory pressure 30% > 20%, cpu pressure 90% > 60%"},
		{0.1, 0.3, "memory pressure 30% > 20%"},
	} {
		hb := brokerapi.Heartbeat{DiskIdle: 0.9, CPUPressure: c.cpu, MemoryPressure: c.mem}
		if got := broker.Unhealthy(h, hb); got != c.want {
			t.Errorf("Unhealthy with cpu pressure %g, memory pressure %g = %q, want %q", c.cpu, c.mem, got, c.want)
		}
	}
	// The threshold is the configured one, not a constant.
	h.CPUPressureMaxPct = 95
	if got := broker.Unhealthy(h, brokerapi.Heartbeat{DiskIdle: 0.9, CPUPressure: 0.9}); got != "" {
		t.Errorf("Unhealthy with cpu pressure 90%% under a 95%% threshold = %q", got)
	}
}

// TestCPUPressureTurnsHostAway: the only host of a group reports its
// tasks waiting for a CPU 90% of the time (over the default 80%): a launch
// is refused, naming CPU pressure, and the admin API shows the value.
// When it reports 10%, it takes launches again.
func TestCPUPressureTurnsHostAway(t *testing.T) {
	r := newRig(t, "", nil)
	cred := r.agent("h1", "desk", "")
	fe := brokerclient.Bearer("frontend-token")
	launch := func(user string) error {
		_, err := r.launch(fe, brokerapi.LaunchRequest{DeliveryGroup: "desk", User: user, Groups: []string{"staff"}})
		return err
	}
	shown := func() map[string]any {
		t.Helper()
		hs := r.adminList("/api/v1/broker/hosts")
		if len(hs) != 1 {
			t.Fatalf("hosts in the admin API = %v, want h1 alone", hs)
		}
		return hs[0]
	}

	r.beat("h1", cred, brokerapi.Heartbeat{DiskIdle: 0.9, CPU: 0.97, CPUPressure: 0.9})
	err := launch("alice")
	want := `no host of delivery group "desk" can take a launch: 1 unhealthy (h1: cpu pressure 90% > 80%)`
	if status(err) != http.StatusServiceUnavailable || err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("launch on a host under CPU pressure: %v\nwant 503 with %q", err, want)
	}
	if h := shown(); h["cpu_pressure"] != 0.9 || h["status"] != "unhealthy" || h["unhealthy"] != "cpu pressure 90% > 80%" {
		t.Fatalf("the host under CPU pressure in the admin API = %v", h)
	}

	// As busy as before, but its tasks no longer wait: CPU busy alone
	// turns nobody away.
	r.beat("h1", cred, brokerapi.Heartbeat{DiskIdle: 0.9, CPU: 0.97, CPUPressure: 0.1})
	if err := launch("alice"); err != nil {
		t.Fatalf("launch once the host's CPU pressure is down to 10%%: %v", err)
	}
	if h := shown(); h["cpu_pressure"] != 0.1 || h["unhealthy"] != "" {
		t.Fatalf("the host after its CPU pressure fell, in the admin API = %v", h)
	}
}
