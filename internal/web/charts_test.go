package web

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestChartsSampleTheRolesMetrics: the dashboard's charts read the gauges
// as they are and the counters as rates per minute, from a real
// Prometheus registry served as /metrics is.
func TestChartsSampleTheRolesMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	tunnels := prometheus.NewGauge(prometheus.GaugeOpts{Name: "deskway_gateway_tunnels_active"})
	auth := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_gateway_auth_total"}, []string{"method", "result"})
	reg.MustRegister(tunnels, auth)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	var sm sampler
	tunnels.Set(3)
	auth.WithLabelValues("ntlm", "failed").Add(1)
	sm.sample(context.Background(), srv.Client(), srv.URL)
	auth.WithLabelValues("ntlm", "failed").Add(5)
	auth.WithLabelValues("ntlm", "ok").Add(100) // not a failure
	sm.sample(context.Background(), srv.Client(), srv.URL)
	// Ten seconds apart, exactly (set after the second sample, whose own
	// time on a busy machine came later than planned): five failures
	// are thirty a minute.
	sm.mu.Lock()
	sm.at[0] = sm.at[1].Add(-10 * time.Second)
	sm.mu.Unlock()
	cs := sm.charts()
	if len(cs) != 4 || cs[0].Title != "Tunnels open" || cs[0].Now != "3" || !strings.HasPrefix(string(cs[0].SVG), "<svg") {
		t.Fatalf("charts = %+v", cs)
	}
	if got := cs[2].Now; got != "30" {
		t.Fatalf("failed logins per minute = %s, want 30", got)
	}
	if cs[1].Now != "0" || cs[3].Now != "0" {
		t.Fatalf("absent families read %s and %s, want 0", cs[1].Now, cs[3].Now)
	}
}
