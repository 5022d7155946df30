package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/policy"
)

// metrics are built per server on the registry passed in.
type metrics struct {
	reg                    prometheus.Registerer
	tunnels                *prometheus.CounterVec
	opened                 prometheus.Counter
	auth                   *prometheus.CounterVec
	farmIn                 *prometheus.CounterVec
	bytesUp, bytesDown     prometheus.Counter
	latencyUp, latencyDown prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "deskway_gateway_relayed_bytes_total", Help: "Payload bytes relayed, by direction (up: client to host).",
	}, []string{"direction"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "deskway_gateway_relay_latency_seconds",
		Help:    "Time from a packet read on one side to its write on the other, by direction.",
		Buckets: []float64{1e-6, 5e-6, 20e-6, 100e-6, 500e-6, 1e-3, 5e-3, 20e-3, 100e-3, 1},
	}, []string{"direction"})
	m := &metrics{
		reg: reg,
		tunnels: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deskway_gateway_tunnels_total", Help: "Tunnels ended, by result (ok, error, refused).",
		}, []string{"result"}),
		opened: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "deskway_gateway_channels_opened_total", Help: "Channels opened to RDP hosts.",
		}),
		auth: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deskway_gateway_auth_total", Help: "Authentication outcomes, by method and result.",
		}, []string{"method", "result"}),
		farmIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "deskway_gateway_farm_legacy_in_total",
			Help: "Legacy IN halves whose OUT half was on another farm node, by result: forwarded (this node carried one to its peer), not_found (no peer held its OUT half), joined (a peer's claim took an OUT half here), refused (a claim broke the pairing rules), bad_claim (not signed with the farm key, or out of time).",
		}, []string{"result"}),
		bytesUp: bytes.WithLabelValues("up"), bytesDown: bytes.WithLabelValues("down"),
		latencyUp: lat.WithLabelValues("up"), latencyDown: lat.WithLabelValues("down"),
	}
	// Every outcome an alert watches is a series from the start, at 0:
	// rate() over a series that appears only with its first event misses
	// that event, and an absent series reads as "no data", not "none".
	for _, r := range []string{"ok", "error", "refused"} {
		m.tunnels.WithLabelValues(r)
	}
	for method, results := range map[string][]string{
		policy.MethodNTLM: {"ok", "failed", "throttled", "malformed"},
		policy.MethodPAA:  {"ok", "failed", "throttled", "replayed"},
		"http":            {"refused"},
		"connection":      {"over_capacity"},
	} {
		for _, r := range results {
			m.auth.WithLabelValues(method, r)
		}
	}
	for _, r := range []string{"forwarded", "not_found", "joined", "refused", "bad_claim", "busy"} {
		m.farmIn.WithLabelValues(r)
	}
	reg.MustRegister(m.tunnels, m.opened, m.auth, m.farmIn, bytes, lat)
	return m
}

func (m *metrics) activeFunc(tunnels, unauthenticated func() float64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "deskway_gateway_tunnels_active", Help: "Tunnels open now, handshaking or relaying.",
	}, tunnels), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "deskway_gateway_unauthenticated_connections", Help: "Connections accepted that have not opened a channel yet.",
	}, unauthenticated))
}

func (s *Server) activeCount() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return float64(len(s.tunnels))
}
