package config

import (
	"fmt"
	"net/netip"
	"time"
)

// SiteHA makes the gateway one of two, an active one and a passive one,
// elected by a lease in a PostgreSQL database both reach: the active
// holds the tunnel endpoint addresses and each tenant's inside addresses,
// the passive takes them over when the active dies or stops.
type SiteHA struct {
	// Database is a postgres:// URL, as env:NAME or file:PATH: it holds
	// the lease (table site_ha_leases, created when missing).
	Database Secret `yaml:"database"`
	// Group names the pair: both gateways give the same group.
	Group string `yaml:"group"`
	// Node names this gateway in the group, in logs and the admin API.
	Node string `yaml:"node"`
	// Lease is how long a lease lasts unrenewed: the longest an active
	// that died holds the addresses before the passive takes them.
	Lease Duration `yaml:"lease"`
	// Addresses are the underlay addresses the active holds: each of
	// site.underlay.addresses, with its prefix length and interface.
	Addresses []SiteAddress `yaml:"addresses"`
}

// SiteAddress is an address with its prefix length (10.0.0.1/24) on an
// interface.
type SiteAddress struct {
	Address   string `yaml:"address"`
	Interface string `yaml:"interface"`
}

// Prefix returns the address with its prefix length; the config has been
// validated.
func (a SiteAddress) Prefix() netip.Prefix {
	p, _ := netip.ParsePrefix(a.Address)
	return p
}

// The bounds of site.ha.lease: below 300 ms a database's hiccup demotes
// the active, above 30 s a failover takes too long to be one.
const (
	minSiteLease = 300 * time.Millisecond
	maxSiteLease = 30 * time.Second
)

func siteHADefaults(s *Site) {
	if s.HA != nil {
		setDefault(&s.HA.Lease, Duration(time.Second))
	}
}

// validateSiteHA checks site.ha and the tenants' inside addresses, which
// only a gateway of a pair has.
func validateSiteHA(s *Site, bad func(string, string, ...any)) {
	h := s.HA
	if h == nil {
		for i, t := range s.Tenants {
			if len(t.Inside) > 0 {
				bad(fmt.Sprintf("site.tenants[%d].inside", i), "inside addresses move between the gateways of a pair: give site.ha too, or remove them")
			}
		}
		return
	}
	if !h.Database.IsSet() {
		bad("site.ha.database", "give the PostgreSQL database that holds the lease, as env:NAME or file:PATH")
	} else if !isReference(h.Database.ref) {
		bad("site.ha.database", "write the database URL as env:NAME or file:PATH: it holds a password, and configuration files are copied and printed")
	} else if v := h.Database.Value(); v != "" && !isPostgres(v) {
		bad("site.ha.database", "%s holds no postgres:// URL", h.Database.ref)
	}
	if !siteName.MatchString(h.Group) {
		bad("site.ha.group", "%q is not 1 to 31 lower-case letters, digits and dashes", h.Group)
	}
	if !siteName.MatchString(h.Node) {
		bad("site.ha.node", "%q is not 1 to 31 lower-case letters, digits and dashes", h.Node)
	}
	if l := h.Lease.D(); l < minSiteLease || l > maxSiteLease {
		bad("site.ha.lease", "%s is not between %s and %s", l, minSiteLease, maxSiteLease)
	}
	endpoints := map[netip.Addr]bool{}
	for _, a := range s.Underlay.Addresses {
		if ip, err := netip.ParseAddr(a); err == nil {
			endpoints[ip] = true
		}
	}
	held := map[netip.Addr]bool{}
	for i, a := range h.Addresses {
		key := fmt.Sprintf("site.ha.addresses[%d]", i)
		p, ok := checkSiteAddress(bad, key, a)
		if !ok {
			continue
		}
		if !endpoints[p.Addr()] {
			bad(key+".address", "%s is not one of site.underlay.addresses", p.Addr())
		}
		held[p.Addr()] = true
	}
	for i, a := range s.Underlay.Addresses {
		if ip, err := netip.ParseAddr(a); err == nil && !held[ip] {
			bad(fmt.Sprintf("site.underlay.addresses[%d]", i), "%s is not in site.ha.addresses: the passive could not take it over", a)
		}
	}
	for i, t := range s.Tenants {
		for j, a := range t.Inside {
			checkSiteAddress(bad, fmt.Sprintf("site.tenants[%d].inside[%d]", i, j), a)
		}
	}
}

// checkSiteAddress checks an address the active holds: IPv4 (IPv6 moves
// by neighbour advertisements, which the pair does not send yet) with
// its prefix length, on a named interface.
func checkSiteAddress(bad func(string, string, ...any), key string, a SiteAddress) (netip.Prefix, bool) {
	ok := true
	p, err := netip.ParsePrefix(a.Address)
	switch {
	case err != nil || !unicast(p.Addr(), nil):
		bad(key+".address", "%q is not an address with its prefix length, such as 10.0.0.1/24", a.Address)
		ok = false
	case !p.Addr().Is4():
		bad(key+".address", "%s is IPv6: a pair of gateways moves IPv4 addresses only", a.Address)
		ok = false
	}
	if !ifName.MatchString(a.Interface) {
		bad(key+".interface", "%q is not an interface name of at most 15 characters", a.Interface)
		ok = false
	}
	return p, ok
}
