package bgp

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are one speaker's; the tenant is a constant label so that every
// tenant's speaker can register in the same registry.
type metrics struct {
	reg       prometheus.Registerer
	peerUp    *prometheus.GaugeVec
	received  prometheus.Gauge
	announced prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, tenant string) (*metrics, error) {
	labels := prometheus.Labels{"tenant": tenant}
	m := &metrics{
		reg: reg,
		peerUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name:        "deskway_site_bgp_peer_established",
			Help:        "1 while the BGP session with the tenant's router is established, else 0.",
			ConstLabels: labels,
		}, []string{"peer"}),
		received: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "deskway_site_bgp_prefixes_received",
			Help:        "Prefixes learnt from the tenant's routers and handed to the routing table (after the accept filter).",
			ConstLabels: labels,
		}),
		announced: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        "deskway_site_bgp_prefixes_announced",
			Help:        "Prefixes the gateway announces to the tenant's routers.",
			ConstLabels: labels,
		}),
	}
	if reg == nil {
		return m, nil
	}
	var done []prometheus.Collector
	for _, c := range []prometheus.Collector{m.peerUp, m.received, m.announced} {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, err
		}
		done = append(done, c)
	}
	return m, nil
}

func (m *metrics) unregister() {
	if m.reg == nil {
		return
	}
	m.reg.Unregister(m.peerUp)
	m.reg.Unregister(m.received)
	m.reg.Unregister(m.announced)
}
