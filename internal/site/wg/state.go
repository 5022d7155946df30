package wg

import (
	"fmt"
	"net/netip"
	"time"
)

// SiteState is one site's tunnel as the device sees it now.
type SiteState struct {
	Name string
	// Endpoint is the configured one; invalid when the office calls in.
	Endpoint netip.AddrPort
	Prefixes []netip.Prefix
	// LastHandshake is zero before the first.
	LastHandshake time.Time
	// Up says a handshake came in the last 180 seconds: the session is
	// usable.
	Up               bool
	RxBytes, TxBytes uint64
	// AllowedIPs are the device's for the site: its prefixes and those a
	// route source learnt behind it.
	AllowedIPs []netip.Prefix
}

// Sites reports each configured site's state; none before Start or
// after Close.
func (d *Device) Sites() ([]SiteState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || !d.started {
		return nil, nil
	}
	text, err := d.dev.IpcGet()
	if err != nil {
		return nil, fmt.Errorf("wg: tenant %s: device state: %w", d.opts.Tenant, err)
	}
	stats, err := parseStats(text)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]SiteState, 0, len(d.cfg.Sites))
	for _, s := range d.cfg.Sites {
		st := stats[s.PublicKey]
		out = append(out, SiteState{Name: s.Name, Endpoint: s.Endpoint, Prefixes: s.Prefixes, LastHandshake: st.lastHandshake,
			Up: !st.lastHandshake.IsZero() && now.Sub(st.lastHandshake) < handshakeFresh, RxBytes: st.rxBytes, TxBytes: st.txBytes, AllowedIPs: st.allowed})
	}
	return out, nil
}
