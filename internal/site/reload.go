package site

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/site/bgp"
	"github.com/deskway/deskway/internal/site/wg"
)

// A reload puts a new, already validated, site section in force without
// a restart. Tenants are matched by name, sites by name within their
// tenant. What did not change is not touched: its device, namespace,
// routes, WireGuard sessions, BGP sessions and counters stay, so the
// connections through it go on. Settings the running process is built
// on (the underlay addresses, a tenant's namespace, device and key, a
// WireGuard interface's name, MTU and addresses) are refused, with the
// key that holds them, before anything changes.

// Check tells whether next can be put in force by Reload, naming the key
// of the first setting that takes a restart; it changes nothing.
func (s *Server) Check(next *config.Site) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.check(next)
}

func (s *Server) check(next *config.Site) error {
	if !slices.Equal(next.Underlay.Addresses, s.cfg.Underlay.Addresses) {
		return fmt.Errorf("site.underlay.addresses changes only at a restart (the raw sockets are bound to %s)", strings.Join(s.cfg.Underlay.Addresses, ", "))
	}
	if next.Datapath != s.cfg.Datapath {
		return fmt.Errorf("site.datapath changes only at a restart (it is %s now)", s.cfg.Datapath)
	}
	if next.Underlay.Send != s.cfg.Underlay.Send {
		return fmt.Errorf("site.underlay.send changes only at a restart (GRE leaves as %s now)", s.cfg.Underlay.Send)
	}
	if !reflect.DeepEqual(next.HA, s.cfg.HA) {
		return errors.New("site.ha changes only at a restart (a gateway joins or leaves a pair, or changes its lease, at a start)")
	}
	if s.ha != nil {
		if err := s.checkPair(next); err != nil {
			return err
		}
	}
	for i, c := range next.Tenants {
		t := s.tenant(c.Name)
		if t == nil {
			continue
		}
		key := fmt.Sprintf("site.tenants[%d]", i)
		switch {
		case c.Namespace != t.cfg.Namespace:
			return fmt.Errorf("%s.namespace of tenant %s changes only at a restart (it is %s)", key, c.Name, t.cfg.Namespace)
		case c.Interface != t.cfg.Interface:
			return fmt.Errorf("%s.interface of tenant %s changes only at a restart (it is %s)", key, c.Name, t.cfg.Interface)
		case c.Key != t.cfg.Key:
			return fmt.Errorf("%s.key of tenant %s changes only at a restart (it is %d): remove the tenant and add it under another name to move it to a new key", key, c.Name, t.cfg.Key)
		case s.kp != nil && (c.Sequence != t.cfg.Sequence || c.Checksum != t.cfg.Checksum || c.MTU != t.cfg.MTU):
			// They decide whether the kernel datapath carries the tenant
			// and size its veth, both made at the start.
			return fmt.Errorf("%s: sequence, checksum and mtu of tenant %s change only at a restart with the kernel datapath", key, c.Name)
		}
		if ow, nw := t.cfg.WireGuard, c.WireGuard; ow != nil && nw != nil {
			if what := wgFixed(ow.Config, nw.Config); what != "" {
				return fmt.Errorf("%s.wireguard.%s of tenant %s changes only at a restart", key, what, c.Name)
			}
		}
	}
	return nil
}

// checkPair refuses, in a gateway of a pair, what its election was built
// on: the tenants themselves, their inside addresses and their speakers
// (started and stopped with the active role). Sites, prefixes, GRE
// options and WireGuard change as on a gateway alone.
func (s *Server) checkPair(next *config.Site) error {
	if len(next.Tenants) != len(s.set.Load().list) {
		return errors.New("site.tenants: a gateway of a pair (site.ha) adds and removes tenants only at a restart")
	}
	for i, c := range next.Tenants {
		t := s.tenant(c.Name)
		switch {
		case t == nil:
			return fmt.Errorf("site.tenants[%d]: a gateway of a pair (site.ha) adds and removes tenants only at a restart", i)
		case !reflect.DeepEqual(c.Inside, t.cfg.Inside):
			return fmt.Errorf("site.tenants[%d].inside of tenant %s changes only at a restart in a gateway of a pair", i, c.Name)
		case !reflect.DeepEqual(c.BGP, t.cfg.BGP):
			return fmt.Errorf("site.tenants[%d].bgp of tenant %s changes only at a restart in a gateway of a pair", i, c.Name)
		}
	}
	return nil
}

// wgFixed names the setting of a running WireGuard interface that
// differs between a and b and that wg.Device.Reload cannot change.
func wgFixed(a, b wg.Config) string {
	name := func(c wg.Config) string { return cmp.Or(c.Interface, wg.DefaultInterface) }
	mtu := func(c wg.Config) int { return cmp.Or(c.MTU, wg.DefaultMTU) }
	switch {
	case name(a) != name(b):
		return "interface"
	case mtu(a) != mtu(b):
		return "mtu"
	case !slices.Equal(a.Address, b.Address):
		return "address"
	}
	return ""
}

// tenant is the running tenant named name, or nil.
func (s *Server) tenant(name string) *tenant {
	for _, t := range s.set.Load().list {
		if t.name == name {
			return t
		}
	}
	return nil
}

// Reload puts next in force: tenants removed, changed, then added, each
// change written to the audit trail as actor's from source. A file that
// Check refuses changes nothing. A change that fails half way (a
// namespace that cannot be made) is reported, audited as failed, and the
// others still apply; the failed tenant is tried again at the next
// reload.
func (s *Server) Reload(next *config.Site, actor, source string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.forwarding {
		return errors.New("the site gateway is not forwarding (starting or stopping): nothing was reloaded")
	}
	if err := s.check(next); err != nil {
		return err
	}
	var errs []error
	done := func(action string, err error) {
		if err != nil {
			errs = append(errs, err)
			s.audit(actor, source, action+" failed: "+err.Error(), http.StatusInternalServerError)
			return
		}
		s.audit(actor, source, action, http.StatusOK)
	}
	wanted := map[string]*config.Tenant{}
	for i := range next.Tenants {
		wanted[next.Tenants[i].Name] = &next.Tenants[i]
	}
	// Removed first: a tenant added in the same reload may take a
	// removed one's WireGuard port. The set goes first, so that nothing
	// more is delivered to the tenant while it is taken down.
	var gone []string
	for _, t := range s.set.Load().list {
		if wanted[t.name] == nil {
			gone = append(gone, t.name)
		}
	}
	if len(gone) > 0 {
		old := s.set.Load()
		s.set.Store(old.with(nil, gone...))
		for _, t := range old.list {
			if slices.Contains(gone, t.name) {
				if s.kp != nil {
					s.kp.forget(t)
				}
				s.remove(t)
				s.m.forget(t.name)
				done("site: tenant "+t.name+" removed", nil)
			}
		}
	}
	for i := range next.Tenants {
		c := &next.Tenants[i]
		t := s.tenant(c.Name)
		if t == nil {
			done("site: tenant "+c.Name+" added", s.add(c))
			continue
		}
		if reflect.DeepEqual(*c, t.cfg) {
			continue
		}
		changes, err := s.change(t, c)
		for _, what := range changes {
			done("site: tenant "+t.name+": "+what, nil)
		}
		if err != nil {
			done("site: tenant "+t.name+" changed", err)
		}
	}
	s.cfg = next
	if err := s.kernelSync(); err != nil {
		done("site: the kernel datapath", err)
	}
	return errors.Join(errs...)
}

// add brings a new tenant up and puts it in force.
func (s *Server) add(c *config.Tenant) error {
	t, err := s.newTenant(c)
	if err != nil {
		return err
	}
	if err := s.bringUp(s.runCtx, t); err != nil {
		s.remove(t)
		return err
	}
	s.link(t, t.c())
	s.set.Store(s.set.Load().with([]*tenant{t}))
	s.loop(func() error { return t.encapLoop(s.log) })
	return nil
}

// change moves a running tenant to c and says what changed, one line
// for the tenant's own settings and one per site.
func (s *Server) change(t *tenant, c *config.Tenant) ([]string, error) {
	old := t.c()
	tc, err := newConf(c, old)
	if err != nil {
		return nil, err
	}
	s.link(t, tc)
	var changes []string
	for _, st := range tc.sites {
		switch prev := old.site(st.name); {
		case prev == nil:
			changes = append(changes, fmt.Sprintf("site %s added (peer %s, prefixes %s)", st.name, st.peer, list(st.prefixes)))
		case prev != st:
			changes = append(changes, fmt.Sprintf("site %s changed (peer %s, prefixes %s; were peer %s, prefixes %s)",
				st.name, st.peer, list(st.prefixes), prev.peer, list(prev.prefixes)))
		}
	}
	for _, st := range old.sites {
		if tc.site(st.name) == nil {
			changes = append(changes, "site "+st.name+" removed")
		}
	}
	if err := t.swap(tc); err != nil {
		return changes, err
	}
	var own []string
	if !slices.Equal(c.Prefixes, t.cfg.Prefixes) {
		own = append(own, fmt.Sprintf("prefixes %s (were %s)", strings.Join(c.Prefixes, ", "), strings.Join(t.cfg.Prefixes, ", ")))
	}
	if c.MTU != t.cfg.MTU {
		own = append(own, fmt.Sprintf("mtu %d (was %d)", c.MTU, t.cfg.MTU))
	}
	if c.Sequence != t.cfg.Sequence || c.Checksum != t.cfg.Checksum {
		own = append(own, fmt.Sprintf("sequence %v, checksum %v", c.Sequence, c.Checksum))
	}
	if err := s.changeExtras(t, c, &own); err != nil {
		return append(changes, own...), err
	}
	if len(own) > 0 {
		changes = append(changes, "changed "+strings.Join(own, "; "))
	}
	t.cfg = *c
	return changes, nil
}

func list(ps []netip.Prefix) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, ", ")
}

// swap puts tc in force in a running tenant: the routes of sites' new
// prefixes go in first, then the configuration and the lookup table
// (each swapped whole), then the routes no site has any more. A site
// removed is cut off at the swap: its packets are no longer any site's
// (dropped as not_peer), and nothing is routed to it.
func (t *tenant) swap(tc *tenantConf) error {
	t.routeMu.Lock()
	defer t.routeMu.Unlock()
	h, err := netlink.NewHandleAt(t.ns)
	if err != nil {
		return fmt.Errorf("netlink in namespace %s: %w", t.nsName, err)
	}
	defer h.Close()
	routed := func(c *tenantConf) map[netip.Prefix]bool {
		m := map[netip.Prefix]bool{}
		for _, st := range c.sites {
			for _, p := range st.prefixes {
				m[p] = true
			}
			for _, p := range *st.learnt.Load() {
				m[p] = true
			}
		}
		return m
	}
	old := t.c()
	before, after := routed(old), routed(tc)
	for p := range after {
		if !before[p] {
			if err := h.RouteReplace(&netlink.Route{LinkIndex: t.linkIndex, Dst: prefixNet(p), Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("route %s to %s: %w", p, t.ifName, err)
			}
		}
	}
	if tc.mtu != old.mtu {
		if link, err := h.LinkByIndex(t.linkIndex); err != nil {
			return fmt.Errorf("find %s: %w", t.ifName, err)
		} else if err := h.LinkSetMTU(link, tc.mtu); err != nil {
			return fmt.Errorf("set %s's MTU to %d: %w", t.ifName, tc.mtu, err)
		}
	}
	t.conf.Store(tc)
	t.routes.Store(t.table())
	for p := range before {
		if !after[p] {
			if err := h.RouteDel(&netlink.Route{LinkIndex: t.linkIndex, Dst: prefixNet(p), Scope: netlink.SCOPE_LINK}); err != nil {
				return fmt.Errorf("remove route %s from %s: %w", p, t.ifName, err)
			}
		}
	}
	return nil
}

// changeExtras moves a tenant's WireGuard interface and BGP speaker to
// c, adding to what the changes made. WireGuard sites change through
// the device's own reload, which keeps the other sites' sessions; a
// changed bgp section restarts the speaker (its sessions start again).
func (s *Server) changeExtras(t *tenant, c *config.Tenant, what *[]string) error {
	ow, nw := t.cfg.WireGuard, c.WireGuard
	switch {
	case ow != nil && nw == nil:
		*what = append(*what, "wireguard removed")
		dev := t.extras.wg
		t.setWG(nil)
		s.relearn(t)
		if err := dev.Close(); err != nil {
			return err
		}
	case nw != nil && (ow == nil || !reflect.DeepEqual(ow.Config, nw.Config) || ow.Key() != nw.Key()):
		key, err := wg.ParsePrivateKey(nw.Key())
		if err != nil {
			return fmt.Errorf("wireguard private_key: %w", err)
		}
		if ow == nil {
			*what = append(*what, "wireguard added")
			dev, err := wg.New(nw.Config, key, wg.Options{Tenant: t.name, Namespace: "/run/netns/" + t.nsName, Logger: s.log, Registerer: s.d.Registry})
			if err != nil {
				return err
			}
			if err := dev.Start(s.runCtx); err != nil {
				return err
			}
			t.setWG(dev)
		} else {
			*what = append(*what, "wireguard sites or key changed")
			if err := t.extras.wg.Reload(nw.Config, key); err != nil {
				return err
			}
		}
	}
	if reflect.DeepEqual(t.cfg.BGP, c.BGP) {
		s.relearn(t)
		return nil
	}
	*what = append(*what, "bgp restarted")
	if t.extras.speaker != nil {
		t.extras.speaker.Stop()
		t.extras.speaker, t.extras.sink = nil, nil
	}
	if c.BGP == nil {
		return nil
	}
	sink := &learnSink{t: t, log: s.log, routes: map[netip.Prefix]netip.Addr{}}
	sp, err := bgp.New(*c.BGP, bgp.Options{Tenant: t.name, Netns: "/run/netns/" + t.nsName, Sink: sink, Logger: s.log, Registry: s.d.Registry})
	if err != nil {
		return err
	}
	if err := sp.Start(s.runCtx); err != nil {
		return err
	}
	t.extras.speaker, t.extras.sink = sp, sink
	return nil
}

// relearn hands the speaker's routes to the tenant's sites again: a
// site that changed or came may now hold a route's next hop, and a
// learnt prefix may now overlap a configured one.
func (s *Server) relearn(t *tenant) {
	// In a gateway of a pair the speaker is the election's, and runs
	// only while the node is active; its sink is the tenant's all along.
	if t.extras.sink != nil {
		t.extras.sink.mu.Lock()
		t.extras.sink.apply()
		t.extras.sink.mu.Unlock()
	}
}
