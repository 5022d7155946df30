package site

import (
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/site/wg"
)

func reloadBase() *config.Site {
	return &config.Site{
		Underlay: config.SiteUnderlay{Addresses: []string{"198.51.100.1"}},
		Tenants: []config.Tenant{{Name: "a", Key: 1001, Namespace: "deskway-a", Interface: "dw-a", MTU: 1400, Prefixes: []string{"10.0.0.0/24"},
			Sites:     []config.TenantSite{{Name: "office", Peer: "198.51.100.2", Prefixes: []string{"192.168.1.0/24"}}},
			WireGuard: &config.SiteWireGuard{Config: wg.Config{ListenPort: 51820, Sites: []wg.Site{{Name: "paris"}}}}}},
	}
}

// TestCheckRefusesRestartKeys: a file that changes what the running
// gateway is built on is refused naming the key; what a reload can
// change (sites, prefixes, GRE options, WireGuard sites, a tenant
// added or removed) passes. Check touches nothing, so this runs
// without root.
func TestCheckRefusesRestartKeys(t *testing.T) {
	// New would read the WireGuard key; the check needs only the
	// section in force.
	first := reloadBase()
	wgc := first.Tenants[0].WireGuard
	first.Tenants[0].WireGuard = nil
	s, err := New(first, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	s.tenant("a").cfg.WireGuard = wgc
	for _, c := range []struct {
		edit func(*config.Site)
		want string // "" passes
	}{
		{func(c *config.Site) { c.Underlay.Addresses = []string{"198.51.100.9"} }, "site.underlay.addresses changes only at a restart"},
		{func(c *config.Site) { c.Tenants[0].Namespace = "other" }, "site.tenants[0].namespace of tenant a changes only at a restart"},
		{func(c *config.Site) { c.Tenants[0].Interface = "dw-x" }, "site.tenants[0].interface of tenant a changes only at a restart"},
		{func(c *config.Site) { c.Tenants[0].Key = 7 }, "site.tenants[0].key of tenant a changes only at a restart"},
		{func(c *config.Site) { c.Tenants[0].WireGuard.Interface = "wg1" }, "site.tenants[0].wireguard.interface of tenant a"},
		{func(c *config.Site) { c.Tenants[0].WireGuard.MTU = 1380 }, "site.tenants[0].wireguard.mtu of tenant a"},
		{func(c *config.Site) { c.HA = &config.SiteHA{Group: "pair", Node: "one"} }, "site.ha changes only at a restart"},
		// The defaults written out are no change.
		{func(c *config.Site) {
			c.Tenants[0].WireGuard.Interface, c.Tenants[0].WireGuard.MTU = wg.DefaultInterface, wg.DefaultMTU
		}, ""},
		{func(c *config.Site) {
			c.Tenants[0].MTU, c.Tenants[0].Sequence, c.Tenants[0].Checksum = 1300, true, true
			c.Tenants[0].Prefixes = []string{"10.1.0.0/24"}
			c.Tenants[0].Sites[0].Prefixes = []string{"192.168.2.0/24"}
			c.Tenants[0].WireGuard.Sites = nil
		}, ""},
		// A new tenant may use any namespace and key; a's may move to it
		// once a is removed.
		{func(c *config.Site) { c.Tenants[0].Name = "b" }, ""},
	} {
		next := reloadBase()
		c.edit(next)
		err := s.Check(next)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("refused: %v", err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}
