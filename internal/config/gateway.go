package config

import (
	"encoding/hex"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"time"
)

// Gateway is the RD Gateway role.
type Gateway struct {
	Listen string `yaml:"listen"`
	// PublicName is the host[:port] clients use; it goes into .rdp files.
	PublicName string `yaml:"public_name"`
	// AuthMethods the gateway offers: ntlm, paa.
	AuthMethods    []string `yaml:"auth_methods"`
	Keepalive      Duration `yaml:"keepalive"`
	IdleTimeout    Duration `yaml:"idle_timeout"`
	SessionTimeout Duration `yaml:"session_timeout"`
	// HandshakeTimeout is one wall-clock budget for everything from TCP
	// accept to an open channel (TLS, HTTP, NTLM, websocket upgrade or
	// pairing of the legacy halves, and the MS-TSGU handshake): a
	// connection that has not opened a channel by then is closed.
	HandshakeTimeout Duration `yaml:"handshake_timeout"`
	// WriteTimeout bounds every write to a client or a host: a peer that
	// takes no bytes for this long ends its tunnel.
	WriteTimeout Duration `yaml:"write_timeout"`
	// DialTimeout bounds a connection to a session host. A host that has
	// not answered within a quarter second is sent another attempt beside
	// the first, and so on, until one connects or this runs out.
	DialTimeout Duration `yaml:"dial_timeout"`
	// ShutdownGrace is how long open tunnels may run after SIGTERM.
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// MaxTunnels caps authorized tunnels; connections still
	// authenticating have caps of their own below, so they can never
	// lock authorized users out.
	MaxTunnels int `yaml:"max_tunnels"`
	// TokenMaxUses is how many tunnels one PAA token may open in its
	// lifetime (default 3): the first, then reconnects from the same
	// address, never two at once. 0 makes tokens bearers usable without limit, for
	// benchmarks only.
	TokenMaxUses *int `yaml:"token_max_uses"`
	// ReconnectWindow is how long after its last tunnel closed a PAA
	// token that opened one may still open a reconnect to the same
	// target once it has expired (default 10m), within its uses and from
	// its first address; 0 refuses every expired token.
	ReconnectWindow *Duration `yaml:"reconnect_window"`
	// MaxUnauthenticated caps connections that have not yet opened a
	// channel, in all and from one source address (an IPv6 /64 counts as
	// one address); past either cap new connections are closed at once.
	MaxUnauthenticated        int `yaml:"max_unauthenticated"`
	MaxUnauthenticatedPerAddr int `yaml:"max_unauthenticated_per_address"`
	// RelayLoops is how many event loops relay open websocket tunnels
	// (default: two per CPU the process may use); 0 relays every tunnel on
	// two goroutines of its own instead.
	RelayLoops *int `yaml:"relay_loops"`
	// ConsentMessage, when set, is shown to the user who must accept it.
	ConsentMessage string `yaml:"consent_message"`
	// ServiceMessage, when set, is shown after the tunnel is authorized.
	ServiceMessage string  `yaml:"service_message"`
	CAP            []CAP   `yaml:"connection_policies"`
	RAP            []RAP   `yaml:"resource_policies"`
	RADIUS         *RADIUS `yaml:"radius"`
	// BrowserOrigins are the web origins (scheme://host[:port]) whose
	// pages may open browser sessions on /rdp; empty turns browser
	// sessions off.
	BrowserOrigins []string `yaml:"browser_origins"`
	// BrowserCompression is how the gateway compresses what it sends a
	// browser (permessage-deflate, RFC 7692): off, no_context_takeover
	// (each message on its own) or context_takeover (each message
	// against the 32 KiB the session sent before it; the default).
	BrowserCompression string `yaml:"browser_compression"`
	// BrowserLogonTimeout is how long after a browser session's logon
	// the host has to show a logged-on desktop (its channel server
	// speaking on the clipboard channel) before the gateway ends the
	// session as a refused logon, which the page tells the person, in
	// place of the host's own "login failed" dialog.
	BrowserLogonTimeout Duration `yaml:"browser_logon_timeout"`
	// FarmPeers are the other nodes of a gateway farm (host:port of each
	// one's listener, as this node reaches it). A legacy IN half whose OUT
	// half went to another node behind a load balancer is carried to it.
	// Every node needs the same auth.token_key.
	FarmPeers []string `yaml:"farm_peers"`
	// ProxyProtocolFrom are the load balancers (addresses or CIDR
	// prefixes) that pass TCP through and send a PROXY protocol v2 header
	// first (HAProxy's send-proxy-v2 and check-send-proxy), naming the
	// client. Connections from them must carry one; the gateway then sees
	// the client's address for its caps, throttles and logs. With
	// FarmPeers, a connection from them without one is served only as a
	// farm peer's link, which proves itself with the farm key.
	ProxyProtocolFrom []string `yaml:"proxy_protocol_from"`
}

// The values of gateway.browser_compression.
const (
	BrowserCompressionOff     = "off"
	BrowserCompressionMessage = "no_context_takeover"
	BrowserCompressionContext = "context_takeover"
)

// CAP is a connection authorization policy: who may connect, and how.
type CAP struct {
	Name   string   `yaml:"name"`
	Users  []string `yaml:"users"`
	Groups []string `yaml:"groups"`
	// AuthMethods allowed under this policy (ntlm, paa); empty means both.
	AuthMethods []string `yaml:"auth_methods"`
	// Redirection lists device classes the client may redirect: all, none,
	// or some of drives, printers, ports, clipboard, pnp.
	Redirection       []string `yaml:"redirection"`
	IdleTimeout       Duration `yaml:"idle_timeout"`
	SessionTimeout    Duration `yaml:"session_timeout"`
	MaxTunnelsPerUser int      `yaml:"max_tunnels_per_user"`
	// RADIUS asks the central policy server as well; both must allow.
	RADIUS bool `yaml:"radius"`
}

// RAP is a resource authorization policy: which groups reach which hosts.
type RAP struct {
	Name   string   `yaml:"name"`
	Users  []string `yaml:"users"`
	Groups []string `yaml:"groups"`
	// Hosts are IP addresses, CIDR prefixes or DNS names. A name matches
	// the name the client asked for; addresses match what it resolved to.
	Hosts []string `yaml:"hosts"`
	Ports []int    `yaml:"ports"`
	// HostCertSHA256 pins the certificates a browser session may find on
	// these hosts (SHA-256 of the leaf certificate's DER, in hex). The
	// gateway does TLS with the host itself for a browser, which cannot
	// judge the host's certificate; HostCA trusts a CA bundle instead.
	// With neither, the system's roots and the host's name decide.
	HostCertSHA256 []string `yaml:"host_certificate_sha256"`
	HostCA         string   `yaml:"host_certificate_ca"`
}

// RADIUS is the central policy server (Microsoft NPS, FreeRADIUS). When
// configured it is asked for every tunnel; groups it returns in Filter-Id
// attributes count in the policies.
type RADIUS struct {
	Server  string   `yaml:"server"`
	Secret  Secret   `yaml:"secret"`
	Timeout Duration `yaml:"timeout"`
	// NASIdentifier is sent in every request so the server can tell gateways apart.
	NASIdentifier string `yaml:"nas_identifier"`
	// AllowUnsignedResponses accepts answers without a Message-Authenticator,
	// which an attacker on the path can forge (CVE-2024-3596); only for a
	// server that cannot be made to sign its answers.
	AllowUnsignedResponses bool `yaml:"allow_unsigned_responses"`
}

func gatewayDefaults(g *Gateway) {
	setDefault(&g.Listen, ":8443")
	if len(g.AuthMethods) == 0 {
		g.AuthMethods = []string{"ntlm", "paa"}
	}
	setDefault(&g.Keepalive, Duration(30*time.Second))
	setDefault(&g.IdleTimeout, Duration(30*time.Minute))
	setDefault(&g.SessionTimeout, Duration(8*time.Hour))
	setDefault(&g.HandshakeTimeout, Duration(30*time.Second))
	setDefault(&g.WriteTimeout, Duration(30*time.Second))
	setDefault(&g.MaxUnauthenticated, 1024)
	setDefault(&g.MaxUnauthenticatedPerAddr, 64)
	if g.TokenMaxUses == nil {
		// Three, so that a client's auto-reconnect after a dropped link or
		// a dead farm node (its first use on one node, the other half of a
		// legacy pair on another) finds a use left; the later uses are
		// bound to the first's address and never run two at once.
		three := 3
		g.TokenMaxUses = &three
	}
	if g.ReconnectWindow == nil {
		// Long enough for a client's auto-reconnect after a dead farm
		// node or a dropped link, short enough that a token seen by
		// someone else is worth little to them once its session is over.
		w := Duration(10 * time.Minute)
		g.ReconnectWindow = &w
	}
	setDefault(&g.DialTimeout, Duration(10*time.Second))
	setDefault(&g.ShutdownGrace, Duration(30*time.Second))
	setDefault(&g.MaxTunnels, 20000)
	setDefault(&g.BrowserCompression, BrowserCompressionContext)
	setDefault(&g.BrowserLogonTimeout, Duration(30*time.Second))
	if g.RelayLoops == nil {
		// Two per CPU, not one: each loop's tunnels then wait behind
		// fewer others while a loop works through its ready sockets,
		// which held more KW v1 tunnels under 40 ms in the gateway bench.
		n := 2 * runtime.GOMAXPROCS(0)
		g.RelayLoops = &n
	}
	if g.RADIUS != nil {
		setDefault(&g.RADIUS.Timeout, Duration(3*time.Second))
		setDefault(&g.RADIUS.NASIdentifier, "deskway-gateway")
	}
}

func (c *Config) validateGateway(g *Gateway, bad func(string, string, ...any)) {
	checkListen(bad, "gateway.listen", g.Listen)
	checkHostOptionalPort(bad, "gateway.public_name", g.PublicName)
	for _, m := range g.AuthMethods {
		switch m {
		case "ntlm":
		case "paa":
			if !c.Auth.TokenKey.IsSet() {
				bad("gateway.auth_methods", "paa needs auth.token_key")
			}
		default:
			bad("gateway.auth_methods", "%q is not ntlm or paa", m)
		}
	}
	if g.RelayLoops != nil && (*g.RelayLoops < 0 || *g.RelayLoops > 1024) {
		bad("gateway.relay_loops", "must be between 0 (no event loops) and 1024")
	}
	switch g.BrowserCompression {
	case BrowserCompressionOff, BrowserCompressionMessage, BrowserCompressionContext:
	default:
		bad("gateway.browser_compression", "%q is not off, no_context_takeover or context_takeover", g.BrowserCompression)
	}
	if d := g.BrowserLogonTimeout.D(); d < time.Second || d > 10*time.Minute {
		bad("gateway.browser_logon_timeout", "must be between 1s and 10m")
	}
	if g.MaxTunnels < 1 {
		bad("gateway.max_tunnels", "must be at least 1")
	}
	if g.Keepalive.D() < time.Second {
		bad("gateway.keepalive", "must be at least 1s")
	}
	if g.HandshakeTimeout.D() < time.Second {
		bad("gateway.handshake_timeout", "must be at least 1s")
	}
	if g.TokenMaxUses != nil && *g.TokenMaxUses < 0 {
		bad("gateway.token_max_uses", "must be 0 (no limit) or more")
	}
	if w := g.ReconnectWindow; w != nil && (w.D() < 0 || w.D() > 24*time.Hour) {
		bad("gateway.reconnect_window", "must be 0 (no reconnect once a token expired) to 24h")
	}
	if g.WriteTimeout.D() < time.Second {
		bad("gateway.write_timeout", "must be at least 1s")
	}
	if g.MaxUnauthenticated < 1 || g.MaxUnauthenticatedPerAddr < 1 || g.MaxUnauthenticatedPerAddr > g.MaxUnauthenticated {
		bad("gateway.max_unauthenticated_per_address", "caps must be at least 1, the per-address one at most max_unauthenticated (%d)", g.MaxUnauthenticated)
	}
	if c.Farm != nil {
		if d := c.Farm.Database.Value(); !strings.HasPrefix(d, "postgres://") && !strings.HasPrefix(d, "postgresql://") {
			bad("farm.database", "must be a postgres:// URL (the farm's shared PostgreSQL database)")
		}
	}
	if len(g.FarmPeers) > 0 && !c.Auth.TokenKey.IsSet() {
		bad("gateway.farm_peers", "a farm's nodes authenticate each other with a key derived from auth.token_key: set the same token_key on every node")
	}
	checkBalancers(bad, "gateway.proxy_protocol_from", g.ProxyProtocolFrom)
	for i, peer := range g.FarmPeers {
		checkDial(bad, fmt.Sprintf("gateway.farm_peers[%d]", i), peer)
	}
	if len(g.ConsentMessage) > 8000 || len(g.ServiceMessage) > 8000 {
		bad("gateway", "consent and service messages are limited to 8000 characters")
	}
	for i, p := range g.CAP {
		key := fmt.Sprintf("gateway.connection_policies[%d]", i)
		if p.Name == "" {
			bad(key+".name", "is required")
		}
		if len(p.Users) == 0 && len(p.Groups) == 0 {
			bad(key, "policy %q names no users or groups, so it would match nobody", p.Name)
		}
		for _, m := range p.AuthMethods {
			if m != "ntlm" && m != "paa" {
				bad(key+".auth_methods", "%q is not ntlm or paa", m)
			}
		}
		for _, r := range p.Redirection {
			switch r {
			case "all", "none", "drives", "printers", "ports", "clipboard", "pnp":
			default:
				bad(key+".redirection", "%q is not one of all, none, drives, printers, ports, clipboard, pnp", r)
			}
		}
	}
	for i, p := range g.RAP {
		key := fmt.Sprintf("gateway.resource_policies[%d]", i)
		if p.Name == "" {
			bad(key+".name", "is required")
		}
		if len(p.Users) == 0 && len(p.Groups) == 0 {
			bad(key, "policy %q names no users or groups, so it would match nobody", p.Name)
		}
		if len(p.Hosts) == 0 {
			bad(key+".hosts", "policy %q allows no hosts", p.Name)
		}
		for j, h := range p.Hosts {
			checkPolicyHost(bad, fmt.Sprintf("%s.hosts[%d]", key, j), h)
		}
		for j, port := range p.Ports {
			if port < 1 || port > 65535 {
				bad(fmt.Sprintf("%s.ports[%d]", key, j), "port %d is out of range (1 to 65535)", port)
			}
		}
		for j, pin := range p.HostCertSHA256 {
			if _, err := ParseCertPin(pin); err != nil {
				bad(fmt.Sprintf("%s.host_certificate_sha256[%d]", key, j), "%v", err)
			}
		}
		c.checkCAFile(bad, key+".host_certificate_ca", p.HostCA)
	}
	for i, o := range g.BrowserOrigins {
		key := fmt.Sprintf("gateway.browser_origins[%d]", i)
		if u, err := url.Parse(o); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Path != "" || u.RawQuery != "" {
			bad(key, "%q is not an origin such as https://portal.example.com", o)
		} else {
			checkURLHost(bad, key, o)
		}
	}
	if r := g.RADIUS; r != nil {
		checkDial(bad, "gateway.radius.server", r.Server)
		if r.Secret.Value() == "" {
			bad("gateway.radius.secret", "is required")
		}
	}
}

// ParseCertPin reads a SHA-256 certificate fingerprint written in hex,
// with or without colons between the bytes.
func ParseCertPin(s string) ([32]byte, error) {
	var pin [32]byte
	h := strings.ReplaceAll(strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "sha256:"), ":", "")
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != len(pin) {
		return pin, fmt.Errorf("%q is not a SHA-256 fingerprint (64 hex digits)", s)
	}
	copy(pin[:], b)
	return pin, nil
}

// ReconnectWindowD is gateway.reconnect_window, 0 when unset.
func (g *Gateway) ReconnectWindowD() time.Duration {
	if g.ReconnectWindow == nil {
		return 0
	}
	return g.ReconnectWindow.D()
}
