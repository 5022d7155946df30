package wg

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"
)

// DefaultMTU is the WireGuard interface's MTU when the config names none:
// 1500 less the outer IPv6, UDP and WireGuard headers (40+8+32).
const DefaultMTU = 1420

// DefaultInterface is the WireGuard interface's name inside the tenant's
// namespace when the config names none.
const DefaultInterface = "wg0"

// Config is one tenant's WireGuard interface: the gateway's side of the
// tunnels to that tenant's sites. A site gateway embeds one per tenant.
type Config struct {
	// Interface is the TUN's name inside the tenant's namespace.
	Interface string `yaml:"interface"`
	// ListenPort is the UDP port in the underlay namespace; each tenant
	// has its own.
	ListenPort int `yaml:"listen_port"`
	// PrivateKey is where the gateway's key for this tenant is read from:
	// file:PATH or env:NAME. The caller resolves it (as config.Secret
	// does) and hands the key to New; an inline key is refused, since
	// configuration files get copied and printed.
	PrivateKey string `yaml:"private_key"`
	// Address lists the interface's own addresses (optional; forwarding
	// between sites and the tenant's network needs none).
	Address []netip.Prefix `yaml:"address"`
	// MTU of the interface; 0 means DefaultMTU.
	MTU int `yaml:"mtu"`
	// Sites are the tenant's offices, one WireGuard peer each.
	Sites []Site `yaml:"sites"`
}

// Site is one office of the tenant: a WireGuard peer whose allowed IPs
// are the office's prefixes, routed through the interface.
type Site struct {
	// Name names the site in logs and metrics, unique in the tenant.
	Name string `yaml:"name"`
	// PublicKey is the office's WireGuard key, as wg pubkey prints it.
	PublicKey PublicKey `yaml:"public_key"`
	// Endpoint is the office's address in the underlay; without one the
	// gateway waits for the office to call (roaming offices, NAT).
	Endpoint netip.AddrPort `yaml:"endpoint"`
	// Prefixes are the office's networks: the peer's allowed IPs and the
	// routes through the interface in the tenant's namespace.
	Prefixes []netip.Prefix `yaml:"prefixes"`
	// PersistentKeepalive keeps a NAT mapping open (25s is usual); 0 is
	// off.
	PersistentKeepalive Keepalive `yaml:"persistent_keepalive"`
}

// Keepalive is a whole number of seconds written as a duration ("25s").
type Keepalive time.Duration

// UnmarshalText implements encoding.TextUnmarshaler (YAML scalars).
func (k *Keepalive) UnmarshalText(b []byte) error {
	d, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (write it like 25s)", b)
	}
	*k = Keepalive(d)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (k Keepalive) MarshalText() ([]byte, error) { return []byte(time.Duration(k).String()), nil }

// seconds is the interval as the UAPI protocol writes it.
func (k Keepalive) seconds() int { return int(time.Duration(k) / time.Second) }

// ifname is what Linux accepts as an interface name.
var ifname = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)

// siteName keeps site names usable as metric label values and in logs.
var siteName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// withDefaults returns c with the defaults filled in.
func (c Config) withDefaults() Config {
	if c.Interface == "" {
		c.Interface = DefaultInterface
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	return c
}

// Validate checks c and names the key of each problem, relative to the
// tenant's wireguard section (listen_port, sites[1].prefixes[0], ...).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if !ifname.MatchString(c.Interface) {
		bad("interface", "%q is not an interface name (1 to 15 letters, digits, _ . -)", c.Interface)
	}
	if c.ListenPort < 1 || c.ListenPort > 65535 {
		bad("listen_port", "%d is not a UDP port (1 to 65535); each tenant needs its own", c.ListenPort)
	}
	switch {
	case c.PrivateKey == "":
		bad("private_key", "missing: give file:PATH to a key written by wg genkey")
	case strings.HasPrefix(c.PrivateKey, "file:") && len(c.PrivateKey) > len("file:"),
		strings.HasPrefix(c.PrivateKey, "env:") && len(c.PrivateKey) > len("env:"):
	default:
		// The value may be the key itself: never echo it.
		bad("private_key", "write file:PATH or env:NAME; a key written inline would travel with every copy of the configuration")
	}
	if c.MTU < 1280 || c.MTU > 9000 {
		bad("mtu", "%d is outside 1280 to 9000", c.MTU)
	}
	for i, a := range c.Address {
		if !a.IsValid() {
			bad(fmt.Sprintf("address[%d]", i), "not an address with a prefix length (like 172.31.0.1/32)")
		}
	}
	if len(c.Sites) == 0 {
		bad("sites", "no sites: a WireGuard interface needs at least one")
	}
	names := map[string]int{}
	keys := map[PublicKey]int{}
	type owned struct {
		p    netip.Prefix
		site int
		key  string
	}
	var all []owned
	for i, s := range c.Sites {
		at := fmt.Sprintf("sites[%d]", i)
		if !siteName.MatchString(s.Name) {
			bad(at+".name", "%q is not a site name (letters, digits, _ . -, up to 63)", s.Name)
		} else if j, dup := names[s.Name]; dup {
			bad(at+".name", "%q is also sites[%d]", s.Name, j)
		} else {
			names[s.Name] = i
		}
		if s.PublicKey.IsZero() {
			bad(at+".public_key", "missing: the office's key as wg pubkey prints it")
		} else if j, dup := keys[s.PublicKey]; dup {
			bad(at+".public_key", "the same key as sites[%d]: each office has its own", j)
		} else {
			keys[s.PublicKey] = i
		}
		if s.Endpoint.IsValid() && (s.Endpoint.Port() == 0 || s.Endpoint.Addr().IsUnspecified()) {
			bad(at+".endpoint", "%s needs an address and a port", s.Endpoint)
		}
		k := time.Duration(s.PersistentKeepalive)
		if k < 0 || k > 65535*time.Second || k%time.Second != 0 {
			bad(at+".persistent_keepalive", "%s is not whole seconds from 0s to 65535s", k)
		}
		if len(s.Prefixes) == 0 {
			bad(at+".prefixes", "none: list the office's networks (like 192.168.1.0/24)")
		}
		for j, p := range s.Prefixes {
			key := fmt.Sprintf("%s.prefixes[%d]", at, j)
			switch {
			case !p.IsValid():
				bad(key, "not a prefix (like 192.168.1.0/24)")
				continue
			case p != p.Masked():
				bad(key, "%s has host bits set; the network is %s", p, p.Masked())
				continue
			}
			for _, o := range all {
				if o.p.Overlaps(p) {
					if o.site == i {
						bad(key, "%s overlaps %s (%s)", p, o.p, o.key)
					} else {
						bad(key, "%s overlaps %s of site %q (%s): a packet to it would have two tunnels", p, o.p, c.Sites[o.site].Name, o.key)
					}
				}
			}
			all = append(all, owned{p, i, key})
		}
	}
	return errors.Join(errs...)
}
