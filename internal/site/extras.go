package site

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/site/bgp"
	"github.com/deskway/deskway/internal/site/wg"
)

// extras are a tenant's optional parts beside GRE: its WireGuard
// interface and its BGP speaker. They start once the tenant's namespace
// exists and stop before it goes.
type extras struct {
	wg      *wg.Device
	speaker *bgp.Speaker
	sink    *learnSink // the speaker's
}

// newExtras checks and builds a tenant's WireGuard device and speaker
// without touching the system.
func (s *Server) newExtras(t *tenant, c *config.Tenant, d Deps) error {
	nsPath := "/run/netns/" + t.nsName
	if w := c.WireGuard; w != nil {
		key, err := wg.ParsePrivateKey(w.Key())
		if err != nil {
			return fmt.Errorf("site: tenant %s: wireguard private_key: %w", t.name, err)
		}
		dev, err := wg.New(w.Config, key, wg.Options{Tenant: t.name, Namespace: nsPath, Logger: s.log, Registerer: d.Registry})
		if err != nil {
			return fmt.Errorf("site: %w", err)
		}
		t.extras.wg = dev
	}
	if c.BGP != nil {
		sink := &learnSink{t: t, log: s.log, routes: map[netip.Prefix]netip.Addr{}}
		sp, err := bgp.New(*c.BGP, bgp.Options{Tenant: t.name, Netns: nsPath, Sink: sink, Logger: s.log, Registry: d.Registry})
		if err != nil {
			return fmt.Errorf("site: %w", err)
		}
		t.extras.speaker, t.extras.sink = sp, sink
	}
	return nil
}

// startExtras starts the tenant's WireGuard device and speaker; its
// namespace exists.
func (t *tenant) startExtras(ctx context.Context) error {
	if t.extras.wg != nil {
		if err := t.extras.wg.Start(ctx); err != nil {
			return err
		}
	}
	if t.extras.speaker != nil {
		if err := t.extras.speaker.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// stopExtras stops the speaker (its routes are taken back) and removes
// the WireGuard interface; either may never have started.
func (t *tenant) stopExtras() error {
	var err error
	if t.extras.speaker != nil {
		t.extras.speaker.Stop()
	}
	if t.extras.wg != nil {
		err = t.extras.wg.Close()
	}
	return err
}

// learnSink takes a tenant's BGP routes to its sites. A learnt prefix
// belongs to the site whose configured prefixes hold its next hop: the
// router that announced it is reached through that site's tunnel. A
// GRE site's go to the tenant's routing table; a WireGuard site's join
// the site's allowed IPs and are routed through its interface. A route
// whose next hop is behind no site (an address in the hosted network)
// is not installed.
type learnSink struct {
	t   *tenant
	log *slog.Logger

	mu     sync.Mutex
	routes map[netip.Prefix]netip.Addr // every route the speaker holds
}

// Add implements bgp.RouteSink.
func (l *learnSink) Add(p netip.Prefix, nh netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.routes[p] = nh
	l.apply()
}

// Remove implements bgp.RouteSink.
func (l *learnSink) Remove(p netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.routes, p)
	l.apply()
}

// apply hands every site its learnt prefixes whole, as learn wants them.
func (l *learnSink) apply() {
	per, perWG := map[string][]netip.Prefix{}, map[string][]netip.Prefix{}
	dev := l.t.extras.wg // changed by a reload with l.mu held
	for p, nh := range l.routes {
		if st := l.t.siteOf(nh); st != nil {
			per[st.name] = append(per[st.name], p)
			continue
		}
		if dev != nil {
			if name := dev.SiteOf(nh); name != "" {
				if why := l.t.refuseWG(dev, p); why != "" {
					l.log.Warn("a BGP route behind a WireGuard site is refused", "tenant", l.t.name, "prefix", p, "site", name, "why", why)
					continue
				}
				perWG[name] = append(perWG[name], p)
				continue
			}
		}
		l.log.Warn("a BGP route's next hop is behind none of the tenant's sites; not installed",
			"tenant", l.t.name, "prefix", p, "next_hop", nh)
	}
	if dev != nil {
		for _, name := range dev.SiteNames() {
			list := perWG[name]
			slices.SortFunc(list, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
			if err := dev.Learn(name, list); err != nil {
				l.log.Warn("BGP routes not all installed", "tenant", l.t.name, "site", name, "error", err)
			}
		}
	}
	// Removals first: a prefix whose next hop moved to another site is
	// refused there while the site it leaves still holds it.
	sites := l.t.c().sites
	for _, st := range sites {
		old := *st.learnt.Load()
		kept := slices.DeleteFunc(slices.Clone(per[st.name]), func(p netip.Prefix) bool { return !slices.Contains(old, p) })
		if len(kept) != len(old) {
			l.learn(st.name, kept)
		}
	}
	for _, st := range sites {
		l.learn(st.name, per[st.name])
	}
}

func (l *learnSink) learn(site string, list []netip.Prefix) {
	slices.SortFunc(list, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if err := l.t.learn(site, list); err != nil {
		l.log.Warn("BGP routes not all installed", "tenant", l.t.name, "site", site, "error", err)
	}
	if f := l.t.onLearnt.Load(); f != nil {
		if err := (*f)(); err != nil {
			l.log.Warn("the kernel datapath did not take the learnt sources", "tenant", l.t.name, "site", site, "error", err)
		}
	}
}

// refuseWG says why p may not be learnt behind a WireGuard site, or "":
// it would overlap the tenant's hosted networks or a site's configured
// prefixes (the file wins).
func (t *tenant) refuseWG(dev *wg.Device, p netip.Prefix) string {
	tc := t.c()
	for _, q := range tc.own {
		if p.Overlaps(q) {
			return fmt.Sprintf("overlaps the tenant's hosted network %s", q)
		}
	}
	for _, st := range tc.sites {
		for _, q := range st.prefixes {
			if p.Overlaps(q) {
				return fmt.Sprintf("overlaps %s, configured for site %s", q, st.name)
			}
		}
	}
	for _, q := range dev.Prefixes() {
		if p.Overlaps(q) {
			return fmt.Sprintf("overlaps %s, configured for a WireGuard site", q)
		}
	}
	return ""
}

// setWG changes the tenant's WireGuard device under its speaker's sink
// lock, which the sink reads it under.
func (t *tenant) setWG(dev *wg.Device) {
	if sink := t.extras.sink; sink != nil {
		sink.mu.Lock()
		defer sink.mu.Unlock()
	}
	t.extras.wg = dev
}

// siteOf is the GRE site whose configured prefixes hold addr, or nil.
func (t *tenant) siteOf(addr netip.Addr) *peerSite {
	for _, st := range t.c().sites {
		for _, p := range st.prefixes {
			if p.Contains(addr) {
				return st
			}
		}
	}
	return nil
}
