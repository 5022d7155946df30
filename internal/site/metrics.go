package site

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/proto/gre"
)

// cause is why a packet was dropped.
type cause int

// The causes of drops; the first ones are gre.Kind's, by value.
const (
	dropShort             = cause(gre.Short)
	dropVersion           = cause(gre.BadVersion)
	dropReserved          = cause(gre.Reserved)
	dropProtocol          = cause(gre.BadProtocol)
	dropChecksum          = cause(gre.BadChecksum)
	dropTooLong           = cause(gre.TooLong)
	dropNoKey       cause = iota + 1 // GRE without a key: no tenant named
	dropUnknownKey                   // a key of no tenant
	dropNotPeer                      // from an address that is none of the tenant's sites
	dropBadInner                     // the payload is not an IP packet of its protocol type
	dropSpoofed                      // inner source outside the sending site's prefixes
	dropNoRoute                      // to a destination behind none of the tenant's sites
	dropTooBig                       // bigger than the tunnel's MTU
	dropSendError                    // the underlay refused it
	dropDeviceError                  // the TUN device refused it
	numCauses
)

var causeNames = [numCauses]string{
	dropShort: "short", dropVersion: "version", dropReserved: "reserved", dropProtocol: "protocol",
	dropChecksum: "checksum", dropTooLong: "too_long", dropNoKey: "no_key", dropUnknownKey: "unknown_key",
	dropNotPeer: "not_peer", dropBadInner: "bad_inner", dropSpoofed: "spoofed", dropNoRoute: "no_route",
	dropTooBig: "too_big", dropSendError: "send_error", dropDeviceError: "device_error",
}

// metrics are the role's Prometheus series and the counts the admin API
// reads back.
type metrics struct {
	packets, bytes, drops, keepalives *prometheus.CounterVec
	// unknown counts drops that name no tenant (bad GRE, unknown key).
	unknown *tenantMetrics
}

// tenantMetrics are one tenant's series, looked up once.
type tenantMetrics struct {
	pktsIn, pktsOut, bytesIn, bytesOut prometheus.Counter
	keepalives                         prometheus.Counter
	drops                              [numCauses]prometheus.Counter
	dropCount                          [numCauses]atomic.Uint64
}

func newMetrics(reg prometheus.Registerer) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		packets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_site_packets_total",
			Help: "Inner packets forwarded, by tenant and direction (in: from a site into the tenant's namespace; out: to a site)."}, []string{"tenant", "direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_site_bytes_total",
			Help: "Bytes of inner packets forwarded, by tenant and direction."}, []string{"tenant", "direction"}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_site_drops_total",
			Help: "Packets dropped, by tenant (empty when none is known) and cause."}, []string{"tenant", "cause"}),
	}
	m.keepalives = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_site_keepalives_total",
		Help: "GRE keepalives (a router's packet addressed back to itself inside the tunnel) sent back to the site, by tenant."}, []string{"tenant"})
	reg.MustRegister(m.packets, m.bytes, m.drops, m.keepalives)
	m.unknown = m.tenant("")
	return m
}

// tenant makes a tenant's series, every cause at 0 from the start.
func (m *metrics) tenant(name string) *tenantMetrics {
	tm := &tenantMetrics{
		pktsIn: m.packets.WithLabelValues(name, "in"), pktsOut: m.packets.WithLabelValues(name, "out"),
		bytesIn: m.bytes.WithLabelValues(name, "in"), bytesOut: m.bytes.WithLabelValues(name, "out"),
		keepalives: m.keepalives.WithLabelValues(name),
	}
	for c := cause(1); c < numCauses; c++ {
		if causeNames[c] != "" {
			tm.drops[c] = m.drops.WithLabelValues(name, causeNames[c])
		}
	}
	return tm
}

// forget removes a tenant's series: a reload removed it.
func (m *metrics) forget(name string) {
	for _, v := range []*prometheus.CounterVec{m.packets, m.bytes, m.drops, m.keepalives} {
		v.DeletePartialMatch(prometheus.Labels{"tenant": name})
	}
}

func (tm *tenantMetrics) drop(c cause) { tm.dropN(c, 1) }

// dropN counts n drops of cause c at once (the kernel datapath's,
// read from its counters).
func (tm *tenantMetrics) dropN(c cause, n uint64) {
	if n == 0 {
		return
	}
	tm.drops[c].Add(float64(n))
	tm.dropCount[c].Add(n)
}

// dropped is the tenant's drops by cause name, the causes seen only.
func (tm *tenantMetrics) dropped() map[string]uint64 {
	out := map[string]uint64{}
	for c := cause(1); c < numCauses; c++ {
		if n := tm.dropCount[c].Load(); n > 0 {
			out[causeNames[c]] = n
		}
	}
	return out
}
