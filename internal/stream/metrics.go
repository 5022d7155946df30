package stream

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/proto/nbd"
)

// metrics are built per server on the registry passed in.
type metrics struct {
	byCmd                 [nbd.CmdResize + 1]prometheus.Counter // requests, resolved once
	conns, boots          prometheus.Gauge
	refused               prometheus.Counter
	requests, errors      *prometheus.CounterVec
	readBytes, writeBytes prometheus.Counter
	cacheFull             prometheus.Counter
}

// newMetrics registers the stream metrics; cacheBytes reports the RAM
// held by write caches at scrape time.
func newMetrics(reg prometheus.Registerer, cacheBytes func() float64, charged func() float64) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		conns: prometheus.NewGauge(prometheus.GaugeOpts{Name: "deskway_stream_connections",
			Help: "NBD connections in the transmission phase."}),
		boots: prometheus.NewGauge(prometheus.GaugeOpts{Name: "deskway_stream_boots",
			Help: "Client boots whose write caches are alive."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "deskway_stream_negotiations_failed_total",
			Help: "Connections that ended during NBD negotiation with an error."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_stream_requests_total",
			Help: "NBD requests served, by command."}, []string{"command"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_stream_request_errors_total",
			Help: "NBD requests answered with an error, by errno."}, []string{"errno"}),
		readBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "deskway_stream_read_bytes_total",
			Help: "Bytes served to NBD_CMD_READ."}),
		writeBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "deskway_stream_written_bytes_total",
			Help: "Bytes taken into write caches by NBD_CMD_WRITE."}),
		cacheFull: prometheus.NewCounter(prometheus.CounterOpts{Name: "deskway_stream_cache_full_total",
			Help: "Writes refused with ENOSPC because they would take write caches past stream.max_cache_mb or stream.max_cache_mb_per_client."}),
	}
	for cmd := nbd.CmdRead; cmd <= nbd.CmdResize; cmd++ {
		m.byCmd[cmd] = m.requests.WithLabelValues(cmdLabel(cmd))
	}
	// Every errno the server answers with is a series at 0 from the
	// start, so that an alert on its rate sees the first error.
	for _, e := range []nbd.Errno{nbd.EPERM, nbd.EIO, nbd.ENOMEM, nbd.EINVAL, nbd.ENOSPC, nbd.EOVERFLOW, nbd.ENOTSUP, nbd.ESHUTDOWN} {
		m.errors.WithLabelValues(e.String())
	}
	reg.MustRegister(m.conns, m.boots, m.refused, m.requests, m.errors, m.readBytes, m.writeBytes, m.cacheFull,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "deskway_stream_cache_ram_bytes",
			Help: "RAM held by client boots' write caches."}, cacheBytes),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "deskway_stream_cache_quota_bytes",
			Help: "Write-cache bytes charged against stream.max_cache_mb (held, and reserved by writes in progress)."}, charged))
	return m
}

// request is the counter for cmd, without a label lookup per request.
func (m *metrics) request(cmd nbd.Cmd) prometheus.Counter {
	if int(cmd) < len(m.byCmd) {
		return m.byCmd[cmd]
	}
	return m.requests.WithLabelValues("other")
}
