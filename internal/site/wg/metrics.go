package wg

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// handshakeFresh is how long a session lives without a new handshake
// (wireguard-go's RejectAfterTime): a site whose last handshake is older
// carries no traffic until it makes another.
const handshakeFresh = 180 * time.Second

// collector reads the peers' counters from the device at each scrape.
// Every tenant's Device registers one on the same registry; their
// descriptions differ by the constant tenant label.
type collector struct {
	d                    *Device
	age, up, rx, tx, cnt *prometheus.Desc
}

func newCollector(d *Device) *collector {
	tenant := prometheus.Labels{"tenant": d.opts.Tenant}
	site := []string{"site"}
	return &collector{
		d: d,
		age: prometheus.NewDesc("deskway_site_wg_handshake_age_seconds",
			"Time since the site's last WireGuard handshake (absent before the first).", site, tenant),
		up: prometheus.NewDesc("deskway_site_wg_site_up",
			"1 if the site made a handshake in the last 180 seconds (its session is usable), else 0.", site, tenant),
		rx: prometheus.NewDesc("deskway_site_wg_receive_bytes_total",
			"Bytes received from the site through the tunnel (the device's count, from its start).", site, tenant),
		tx: prometheus.NewDesc("deskway_site_wg_transmit_bytes_total",
			"Bytes sent to the site through the tunnel (the device's count, from its start).", site, tenant),
		cnt: prometheus.NewDesc("deskway_site_wg_sites",
			"Sites configured on the tenant's WireGuard interface.", nil, tenant),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.age, c.up, c.rx, c.tx, c.cnt} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || !d.started {
		return
	}
	text, err := d.dev.IpcGet()
	if err != nil {
		d.log.Error("wireguard stats", "err", err)
		return
	}
	stats, err := parseStats(text)
	if err != nil {
		d.log.Error("wireguard stats", "err", err)
		return
	}
	now := time.Now()
	ch <- prometheus.MustNewConstMetric(c.cnt, prometheus.GaugeValue, float64(len(d.cfg.Sites)))
	for _, s := range d.cfg.Sites {
		st := stats[s.PublicKey]
		up := 0.0
		if !st.lastHandshake.IsZero() {
			age := now.Sub(st.lastHandshake)
			ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age.Seconds(), s.Name)
			if age < handshakeFresh {
				up = 1
			}
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, s.Name)
		ch <- prometheus.MustNewConstMetric(c.rx, prometheus.CounterValue, float64(st.rxBytes), s.Name)
		ch <- prometheus.MustNewConstMetric(c.tx, prometheus.CounterValue, float64(st.txBytes), s.Name)
	}
}
