package bgp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"time"
)

// Config is one tenant's BGP section, as the site configuration writes
// it under the tenant. Addresses and prefixes are written as text and
// checked by Validate, which names the key of each mistake.
type Config struct {
	// ASN is the gateway's own autonomous system number for this tenant.
	ASN uint32 `yaml:"asn"`
	// RouterID is the BGP identifier, an IPv4 address (RFC 6286 allows
	// any 32-bit value; GoBGP wants it written as an IPv4 address).
	RouterID string `yaml:"router_id"`
	// Listen are the addresses in the tenant's namespace the gateway
	// accepts sessions on.
	Listen []string `yaml:"listen"`
	// Port is the TCP port to listen on (default 179).
	Port uint16 `yaml:"port"`
	// Peers are the tenant's routers; no other address may open a session.
	Peers []Peer `yaml:"peers"`
	// Announce are the prefixes the gateway announces to the tenant.
	Announce []string `yaml:"announce"`
	// Accept, when set, is the only space the tenant's prefixes may come
	// from: a learnt prefix is kept only if one of these contains it.
	// Without it every prefix a peer sends is learnt.
	Accept []string `yaml:"accept"`
}

// Peer is one of the tenant's routers.
type Peer struct {
	// Address is the router's address as seen in the tenant's namespace.
	Address string `yaml:"address"`
	// ASN is the router's autonomous system number.
	ASN uint32 `yaml:"asn"`
	// Password is the TCP MD5 key (RFC 2385), if the router uses one.
	Password Secret `yaml:"password"`
	// HoldTime is the BGP hold time offered (default 90s; at least 3s).
	HoldTime time.Duration `yaml:"hold_time"`
	// MaxPrefixes is the most prefixes of each family (IPv4, IPv6) the
	// router may send before the session is torn down (default 1000).
	MaxPrefixes uint32 `yaml:"max_prefixes"`
}

// Defaults the package applies to keys left out.
const (
	DefaultPort        = 179
	DefaultHoldTime    = 90 * time.Second
	DefaultMaxPrefixes = 1000
)

// Secret is a value written inline, as env:NAME or as file:PATH. The
// caller resolves references (the way the rest of the configuration
// does) and stores the value before handing the Config to New; New uses
// the text as the key. It never prints.
type Secret string

// String hides the value.
func (s Secret) String() string { return "REDACTED" }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue("REDACTED") }

// MarshalYAML keeps references and hides inline values.
func (s Secret) MarshalYAML() (any, error) {
	v := string(s)
	if v == "" || strings.HasPrefix(v, "env:") || strings.HasPrefix(v, "file:") {
		return v, nil
	}
	return "REDACTED", nil
}

// Validate checks c; each error names the key under prefix (the path of
// this section in the file, such as "site.tenants[0].bgp").
func (c *Config) Validate(prefix string) error {
	key := func(k string) string {
		if prefix == "" {
			return k
		}
		return prefix + "." + k
	}
	var errs []error
	bad := func(k, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key(k), fmt.Sprintf(format, a...)))
	}
	if c.ASN == 0 {
		bad("asn", "the gateway's AS number is missing (1 to 4294967295)")
	}
	if a, err := netip.ParseAddr(c.RouterID); err != nil || !a.Is4() {
		bad("router_id", "%q is not an IPv4 address (the BGP identifier is written as one)", c.RouterID)
	}
	if len(c.Listen) == 0 {
		bad("listen", "at least one address in the tenant's network to accept sessions on is needed")
	}
	for i, l := range c.Listen {
		if _, err := netip.ParseAddr(l); err != nil {
			bad(fmt.Sprintf("listen[%d]", i), "%q is not an IP address", l)
		}
	}
	if len(c.Peers) == 0 {
		bad("peers", "at least one of the tenant's routers is needed")
	}
	seen := map[netip.Addr]int{}
	for i, p := range c.Peers {
		k := fmt.Sprintf("peers[%d]", i)
		a, err := netip.ParseAddr(p.Address)
		switch {
		case err != nil:
			bad(k+".address", "%q is not an IP address", p.Address)
		case a.Zone() != "":
			bad(k+".address", "%q has a zone; write the router's address without %%zone", p.Address)
		default:
			if j, dup := seen[a]; dup {
				bad(k+".address", "%s is already peers[%d]", a, j)
			}
			seen[a] = i
		}
		if p.ASN == 0 {
			bad(k+".asn", "the router's AS number is missing (1 to 4294967295)")
		}
		if p.HoldTime != 0 && (p.HoldTime < 3*time.Second || p.HoldTime > 65535*time.Second || p.HoldTime%time.Second != 0) {
			bad(k+".hold_time", "%s is not a whole number of seconds from 3s to 65535s (RFC 4271)", p.HoldTime)
		}
		if strings.HasPrefix(string(p.Password), "env:") || strings.HasPrefix(string(p.Password), "file:") {
			bad(k+".password", "the reference was not resolved before the BGP settings were used")
		} else if len(p.Password) > 80 {
			bad(k+".password", "a TCP MD5 key is at most 80 bytes (Linux's limit)")
		}
	}
	for i, s := range c.Announce {
		if _, err := parsePrefix(s); err != nil {
			bad(fmt.Sprintf("announce[%d]", i), "%v", err)
		}
	}
	for i, s := range c.Accept {
		if _, err := parsePrefix(s); err != nil {
			bad(fmt.Sprintf("accept[%d]", i), "%v", err)
		}
	}
	return errors.Join(errs...)
}

// parsePrefix accepts a prefix written with its host bits clear, so that
// 10.0.0.1/24 (a likely typo for an address) is not silently widened.
func parsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a prefix (write it like 10.0.0.0/24 or 2001:db8::/48)", s)
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set; the prefix is %s", s, p.Masked())
	}
	return p, nil
}

// prefixes parses a validated list.
func prefixes(list []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, _ := parsePrefix(s)
		out = append(out, p)
	}
	return out
}

func (p Peer) holdTime() time.Duration {
	if p.HoldTime == 0 {
		return DefaultHoldTime
	}
	return p.HoldTime
}

func (p Peer) maxPrefixes() uint32 {
	if p.MaxPrefixes == 0 {
		return DefaultMaxPrefixes
	}
	return p.MaxPrefixes
}

func (c *Config) port() uint16 {
	if c.Port == 0 {
		return DefaultPort
	}
	return c.Port
}
