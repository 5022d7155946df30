package site

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/gaissmai/bart"
	"github.com/vishvananda/netlink"
)

// Learn replaces the prefixes a route source (BGP with the tenant's
// router) learnt behind one of a tenant's sites: they are routed to the
// tunnel in the tenant's namespace and accepted as the site's packets'
// sources, beside the site's configured prefixes. A prefix that
// overlaps the tenant's hosted networks or any site's configured
// prefixes is refused (the configuration wins), and so is one another
// site learnt; the rest take effect, and the error names the refused.
func (s *Server) Learn(tenant, site string, learnt []netip.Prefix) error {
	for _, t := range s.set.Load().list {
		if t.name == tenant {
			err := t.learn(site, learnt)
			// The kernel datapath takes the learnt sources in too; the
			// learnt routes stay on the TUN device (docs/site.md).
			return errors.Join(err, s.kernelSync())
		}
	}
	return fmt.Errorf("site: no tenant %s", tenant)
}

func (t *tenant) learn(site string, learnt []netip.Prefix) error {
	t.routeMu.Lock()
	defer t.routeMu.Unlock()
	st := t.c().site(site)
	if st == nil {
		return fmt.Errorf("site: tenant %s has no site %s", t.name, site)
	}
	if t.linkIndex == 0 {
		return fmt.Errorf("site: tenant %s is not up", t.name)
	}
	var keep []netip.Prefix
	var refused []error
	for _, p := range learnt {
		p = p.Masked()
		if why := t.refuse(st, p); why != "" {
			refused = append(refused, fmt.Errorf("%s: %s", p, why))
			continue
		}
		if !slices.Contains(keep, p) {
			keep = append(keep, p)
		}
	}
	h, err := netlink.NewHandleAt(t.ns)
	if err != nil {
		return fmt.Errorf("site: netlink in namespace %s: %w", t.nsName, err)
	}
	defer h.Close()
	old := *st.learnt.Load()
	for _, p := range keep {
		if !slices.Contains(old, p) {
			if err := h.RouteReplace(&netlink.Route{LinkIndex: t.linkIndex, Dst: prefixNet(p), Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("site: route %s to %s: %w", p, t.ifName, err)
			}
		}
	}
	for _, p := range old {
		if !slices.Contains(keep, p) {
			if err := h.RouteDel(&netlink.Route{LinkIndex: t.linkIndex, Dst: prefixNet(p), Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("site: remove route %s from %s: %w", p, t.ifName, err)
			}
		}
	}
	st.learnt.Store(&keep)
	t.routes.Store(t.table())
	if len(refused) > 0 {
		return fmt.Errorf("site: tenant %s, site %s: refused learnt prefixes: %w", t.name, site, errors.Join(refused...))
	}
	return nil
}

// refuse says why p may not be learnt behind st, or "".
func (t *tenant) refuse(st *peerSite, p netip.Prefix) string {
	tc := t.c()
	for _, q := range tc.own {
		if p.Overlaps(q) {
			return fmt.Sprintf("overlaps the tenant's hosted network %s", q)
		}
	}
	for _, o := range tc.sites {
		for _, q := range o.prefixes {
			if p.Overlaps(q) {
				return fmt.Sprintf("overlaps %s, configured for site %s", q, o.name)
			}
		}
		if o != st && slices.Contains(*o.learnt.Load(), p) {
			return fmt.Sprintf("site %s learnt it too", o.name)
		}
	}
	return ""
}

// table maps every site's configured and learnt prefixes to the site.
func (t *tenant) table() *bart.Table[*peerSite] {
	table := new(bart.Table[*peerSite])
	for _, st := range t.c().sites {
		for _, p := range st.prefixes {
			table.Insert(p, st)
		}
		for _, p := range *st.learnt.Load() {
			table.Insert(p, st)
		}
	}
	return table
}
