package wg

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// A route source (BGP with the tenant's router) may learn prefixes behind
// a site: they join the site's allowed IPs, so that the office's packets
// from them are accepted, and are routed through the interface, beside
// the site's configured prefixes. The caller decides which site a prefix
// belongs to and refuses overlaps with the configuration.

// SiteOf names the site whose configured prefixes hold addr, or "".
func (d *Device) SiteOf(addr netip.Addr) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.cfg.Sites {
		for _, p := range s.Prefixes {
			if p.Contains(addr) {
				return s.Name
			}
		}
	}
	return ""
}

// Prefixes are every site's configured prefixes.
func (d *Device) Prefixes() []netip.Prefix {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []netip.Prefix
	for _, s := range d.cfg.Sites {
		out = append(out, s.Prefixes...)
	}
	return out
}

// SiteNames are the configured sites' names.
func (d *Device) SiteNames() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, s := range d.cfg.Sites {
		out = append(out, s.Name)
	}
	return out
}

// Learn replaces the prefixes learnt behind site. The session is kept:
// only the peer's allowed IPs change.
func (d *Device) Learn(site string, learnt []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.started || d.closed {
		return errors.New("wg: the device is not running")
	}
	i := slices.IndexFunc(d.cfg.Sites, func(s Site) bool { return s.Name == site })
	if i < 0 {
		return fmt.Errorf("wg: tenant %s has no WireGuard site %s", d.opts.Tenant, site)
	}
	old := d.learnt[site]
	if slices.Equal(old, learnt) {
		return nil
	}
	s := d.cfg.Sites[i]
	s.Prefixes = append(slices.Clone(s.Prefixes), learnt...)
	var b strings.Builder
	writePeer(&b, s)
	if err := d.dev.IpcSet(b.String()); err != nil {
		return fmt.Errorf("wg: allowed IPs of site %s: %w", site, err)
	}
	for _, p := range learnt {
		if !slices.Contains(old, p) {
			if err := d.link.route(p); err != nil {
				return err
			}
		}
	}
	for _, p := range old {
		if !slices.Contains(learnt, p) {
			if err := d.link.unroute(p); err != nil {
				return err
			}
		}
	}
	if d.learnt == nil {
		d.learnt = map[string][]netip.Prefix{}
	}
	d.learnt[site] = slices.Clone(learnt)
	return nil
}

// withLearnt is c with each site's learnt prefixes among its allowed
// IPs, as the device must be configured.
func (d *Device) withLearnt(c Config) Config {
	c.Sites = slices.Clone(c.Sites)
	for i, s := range c.Sites {
		if l := d.learnt[s.Name]; len(l) > 0 {
			c.Sites[i].Prefixes = append(slices.Clone(s.Prefixes), l...)
		}
	}
	return c
}
