package config

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/deskway/deskway/internal/site/bgp"
	"github.com/deskway/deskway/internal/site/wg"
)

// Site is the site gateway: tenants' office networks reach the networks
// hosted for them through GRE tunnels, each tenant in a network namespace
// of its own (its compartment), so that tenants may use the same
// addresses.
type Site struct {
	// Underlay is this gateway's side of the network the tunnels cross.
	Underlay SiteUnderlay `yaml:"underlay"`
	Tenants  []Tenant     `yaml:"tenants"`
	// HA makes this gateway one of an active and passive pair.
	HA *SiteHA `yaml:"ha"`
	// Datapath is where GRE is encapsulated and decapsulated: "auto"
	// (default), in the kernel where it takes deskway's tc programs,
	// else in userspace; "kernel", refusing to start without them; or
	// "userspace". Restart-only.
	Datapath string `yaml:"datapath"`
}

// SiteUnderlay names the local tunnel endpoint addresses.
type SiteUnderlay struct {
	// Addresses are the local endpoint addresses, at most one IPv4 and
	// one IPv6: GRE is received on them and sent from them.
	Addresses []string `yaml:"addresses"`
	// Send is how GRE to an IPv4 site on Ethernet leaves: "frames"
	// (default), whole frames on a packet socket, which cost less CPU a
	// datagram but skip the underlay's netfilter output hooks; or "ip",
	// every datagram through the kernel's IP output (nftables output and
	// postrouting rules, such as SNAT of the GRE datagrams, apply).
	Send string `yaml:"send"`
}

// Tenant is one routing domain: its compartment, its key and its sites.
type Tenant struct {
	Name string `yaml:"name"`
	// Key is the GRE key that names the tenant on the wire (RFC 2890),
	// unique among the tenants, 1 to 4294967295.
	Key uint32 `yaml:"key"`
	// Namespace is the tenant's network namespace; deskway creates it
	// when it is missing, and removes on stop only one it created.
	Namespace string `yaml:"namespace"`
	// Interface is the tunnel device in the namespace (at most 15
	// characters); default dw-NAME, cut to 15.
	Interface string `yaml:"interface"`
	// MTU is the tunnel's: the largest inner packet sent through it.
	MTU int `yaml:"mtu"`
	// Sequence numbers the packets sent (RFC 2890).
	Sequence bool `yaml:"sequence"`
	// Checksum adds the GRE checksum to packets sent.
	Checksum bool `yaml:"checksum"`
	// Prefixes are the tenant's hosted networks behind the compartment.
	Prefixes []string     `yaml:"prefixes"`
	Sites    []TenantSite `yaml:"sites"`
	// WireGuard is the tenant's encrypted tunnels, one WireGuard
	// interface in its namespace whose peers are its offices.
	WireGuard *SiteWireGuard `yaml:"wireguard"`
	// BGP is the tenant's speaker: its routers teach it their prefixes,
	// which are routed to the GRE site their next hop is behind.
	BGP *bgp.Config `yaml:"bgp"`
	// Inside are the addresses in the tenant's namespace that its hosted
	// network routes the sites' prefixes through: with site.ha, the
	// active gateway holds them.
	Inside []SiteAddress `yaml:"inside"`
}

// SiteWireGuard is a tenant's WireGuard interface, as package wg
// configures it, with its private key read from the reference.
type SiteWireGuard struct {
	wg.Config `yaml:",inline"`
	key       Secret
}

// Key returns the private key read from private_key's file: or env:
// reference.
func (w *SiteWireGuard) Key() string { return w.key.Value() }

// TenantSite is one of a tenant's sites: its router's underlay address
// and the networks behind it.
type TenantSite struct {
	Name string `yaml:"name"`
	// Peer is the site router's underlay address: GRE of the tenant's key
	// is accepted from it alone.
	Peer string `yaml:"peer"`
	// Prefixes are the site's networks: routed to the tunnel in the
	// tenant's namespace, and the only inner sources accepted from Peer.
	Prefixes []string `yaml:"prefixes"`
}

var (
	siteName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,30}$`)
	nsName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	ifName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)
)

func siteDefaults(s *Site) {
	setDefault(&s.Underlay.Send, "frames")
	setDefault(&s.Datapath, "auto")
	for i := range s.Tenants {
		t := &s.Tenants[i]
		setDefault(&t.Namespace, "deskway-"+t.Name)
		if t.Interface == "" {
			t.Interface = "dw-" + t.Name
			if len(t.Interface) > 15 {
				t.Interface = t.Interface[:15]
			}
		}
		setDefault(&t.MTU, 1400)
	}
	siteHADefaults(s)
}

func validateSite(s *Site, bad func(string, string, ...any)) {
	var fams [2]bool // IPv4, IPv6
	gre := false
	for _, t := range s.Tenants {
		gre = gre || len(t.Sites) > 0
	}
	if len(s.Underlay.Addresses) == 0 && (gre || len(s.Tenants) == 0) {
		bad("site.underlay.addresses", "give this gateway's tunnel endpoint address (IPv4, IPv6 or one of each)")
	}
	if s.Underlay.Send != "frames" && s.Underlay.Send != "ip" {
		bad("site.underlay.send", "%q is neither frames (whole frames on a packet socket, the default) nor ip (through the kernel's IP output, where netfilter rules apply)", s.Underlay.Send)
	}
	if s.Datapath != "auto" && s.Datapath != "kernel" && s.Datapath != "userspace" {
		bad("site.datapath", "%q is none of auto (the kernel's where it takes deskway's programs, the default), kernel and userspace", s.Datapath)
	}
	if s.Datapath == "kernel" && !slices.ContainsFunc(s.Underlay.Addresses, func(a string) bool { ip, err := netip.ParseAddr(a); return err == nil && ip.Is4() }) {
		bad("site.datapath", "kernel carries GRE over IPv4: give an IPv4 address in site.underlay.addresses, or use auto or userspace")
	}
	for i, a := range s.Underlay.Addresses {
		key := fmt.Sprintf("site.underlay.addresses[%d]", i)
		ip, err := netip.ParseAddr(a)
		if !unicast(ip, err) {
			bad(key, "%q is not a unicast IP address", a)
			continue
		}
		f := family(ip)
		if fams[f] {
			bad(key, "a second %s address: give at most one of each family", ipName[f])
		}
		fams[f] = true
	}
	if len(s.Tenants) == 0 {
		bad("site.tenants", "give at least one tenant (name, key, sites)")
	}
	names, keys, nss := map[string]bool{}, map[uint32]string{}, map[string]bool{}
	ports := map[int]string{}
	speakers := 0
	for i, t := range s.Tenants {
		key := fmt.Sprintf("site.tenants[%d]", i)
		if !siteName.MatchString(t.Name) {
			bad(key+".name", "%q is not 1 to 31 lower-case letters, digits and dashes", t.Name)
		}
		if names[t.Name] {
			bad(key+".name", "%q appears twice", t.Name)
		}
		names[t.Name] = true
		if t.Key == 0 {
			bad(key+".key", "give the GRE key that names this tenant (1 to 4294967295)")
		} else if other, ok := keys[t.Key]; ok {
			bad(key+".key", "%d is tenant %s's key too: the key names the tenant, so each needs its own", t.Key, other)
		}
		keys[t.Key] = t.Name
		if !nsName.MatchString(t.Namespace) {
			bad(key+".namespace", "%q is not a namespace name", t.Namespace)
		}
		if nss[t.Namespace] {
			bad(key+".namespace", "%q is another tenant's: each tenant is a namespace of its own", t.Namespace)
		}
		nss[t.Namespace] = true
		if !ifName.MatchString(t.Interface) {
			bad(key+".interface", "%q is not an interface name of at most 15 characters", t.Interface)
		}
		if t.MTU < 1280 || t.MTU > 65000 {
			bad(key+".mtu", "%d is not between 1280 (IPv6's least) and 65000", t.MTU)
		}
		own := sitePrefixes(bad, key+".prefixes", t.Prefixes, nil)
		if len(t.Sites) == 0 && t.WireGuard == nil {
			bad(key+".sites", "give at least one site (peer, prefixes), or a wireguard section with its sites")
		}
		peers := map[netip.Addr]bool{}
		seen := own
		for j, st := range t.Sites {
			skey := fmt.Sprintf("%s.sites[%d]", key, j)
			ip, err := netip.ParseAddr(st.Peer)
			switch {
			case !unicast(ip, err):
				bad(skey+".peer", "%q is not a unicast IP address", st.Peer)
			case !fams[family(ip)]:
				bad(skey+".peer", "%s is %s and site.underlay.addresses has no %s address to reach it from", st.Peer, ipName[family(ip)], ipName[family(ip)])
			case peers[ip]:
				bad(skey+".peer", "%s is another site's of this tenant", st.Peer)
			}
			peers[ip] = true
			if len(st.Prefixes) == 0 {
				bad(skey+".prefixes", "give the site's networks (they are routed to it, and its packets must come from them)")
			}
			seen = sitePrefixes(bad, skey+".prefixes", st.Prefixes, seen)
		}
		if w := t.WireGuard; w != nil {
			validateWireGuard(w, t, key+".wireguard", seen, ports, bad)
		}
		if t.BGP != nil {
			speakers++
			if speakers == 2 {
				bad(key+".bgp", "a second tenant with BGP in one process: GoBGP v4.8.0 keeps its route-selection settings in variables all its speakers share, "+
					"so two speakers in one process race; run one deskway site (its own config file) per tenant that has a bgp section")
			}
			sub(bad, key+".bgp", t.BGP.Validate(""))
		}
	}
	validateSiteHA(s, bad)
}

// validateWireGuard checks a tenant's wireguard section: package wg's own
// checks named under the section's path, the key read from private_key,
// a listen port no other tenant uses, an interface name other than the
// GRE device's, and site prefixes that overlap none of the tenant's
// others (a destination would have two tunnels).
func validateWireGuard(w *SiteWireGuard, t Tenant, key string, seen []netip.Prefix, ports map[int]string, bad func(string, string, ...any)) {
	sub(bad, key, w.Validate())
	if w.key.IsSet() && w.key.Value() != "" {
		if _, err := wg.ParsePrivateKey(w.Key()); err != nil {
			bad(key+".private_key", "what %s holds is not a WireGuard private key as wg genkey writes it", w.PrivateKey)
		}
	}
	if other, ok := ports[w.ListenPort]; ok && w.ListenPort != 0 {
		bad(key+".listen_port", "%d is tenant %s's port too: each tenant's WireGuard needs its own UDP port", w.ListenPort, other)
	}
	ports[w.ListenPort] = t.Name
	name := w.Interface
	if name == "" {
		name = wg.DefaultInterface
	}
	if name == t.Interface {
		bad(key+".interface", "%q is the tenant's GRE device too: give the WireGuard interface another name", name)
	}
	for i, st := range w.Sites {
		for j, p := range st.Prefixes {
			for _, q := range seen {
				if p.IsValid() && p.Overlaps(q) {
					bad(fmt.Sprintf("%s.sites[%d].prefixes[%d]", key, i, j), "%s overlaps %s of the same tenant (a hosted network or a GRE site's)", p, q)
				}
			}
		}
	}
}

// sub reports each of a section's own errors ("listen_port: ...", joined)
// under the section's path, so that each names its key and line.
func sub(bad func(string, string, ...any), key string, err error) {
	if err == nil {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		k, msg, ok := strings.Cut(e.Error(), ": ")
		if !ok {
			bad(key, "%s", e.Error())
			continue
		}
		bad(key+"."+k, "%s", msg)
	}
}

// resolveSiteSecrets reads each tenant's WireGuard private key and BGP
// passwords from their env: and file: references.
func resolveSiteSecrets(s *Site, resolve func(string, *Secret)) {
	if s.HA != nil {
		resolve("site.ha.database", &s.HA.Database)
	}
	for i := range s.Tenants {
		t := &s.Tenants[i]
		key := fmt.Sprintf("site.tenants[%d]", i)
		if w := t.WireGuard; w != nil && w.PrivateKey != "" {
			// An inline key is refused by validation; only references are read.
			if strings.HasPrefix(w.PrivateKey, "env:") || strings.HasPrefix(w.PrivateKey, "file:") {
				w.key = Secret{ref: w.PrivateKey}
				resolve(key+".wireguard.private_key", &w.key)
			}
		}
		if b := t.BGP; b != nil {
			for j := range b.Peers {
				p := &b.Peers[j]
				sec := Secret{ref: string(p.Password)}
				resolve(fmt.Sprintf("%s.bgp.peers[%d].password", key, j), &sec)
				p.Password = bgp.Secret(sec.Value())
			}
		}
	}
}

// sitePrefixes checks CIDR prefixes, that none overlaps another of the
// tenant's (an overlap would make a site's packets' source, or a
// destination, ambiguous), and returns seen with them added.
func sitePrefixes(bad func(string, string, ...any), key string, list []string, seen []netip.Prefix) []netip.Prefix {
	for i, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil || p != p.Masked() {
			bad(fmt.Sprintf("%s[%d]", key, i), "%q is not a network in CIDR form such as 192.168.1.0/24", s)
			continue
		}
		for _, q := range seen {
			if p.Overlaps(q) {
				bad(fmt.Sprintf("%s[%d]", key, i), "%s overlaps %s of the same tenant", p, q)
			}
		}
		seen = append(seen, p)
	}
	return seen
}

var ipName = [2]string{"IPv4", "IPv6"}

func family(ip netip.Addr) int {
	if ip.Is4() {
		return 0
	}
	return 1
}

// unicast tells a usable endpoint address: no zone, no IPv4-mapped form
// (a raw IPv6 socket cannot send to it), not unspecified or multicast.
func unicast(ip netip.Addr, err error) bool {
	return err == nil && ip.Zone() == "" && !ip.Is4In6() && !ip.IsUnspecified() && !ip.IsMulticast()
}
