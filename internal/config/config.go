// Package config loads deskway's single YAML file: strict decoding (an
// unknown key is an error naming the key and its line), defaults, and
// validation that names the key at fault. A present section enables its role.
package config

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole file.
type Config struct {
	// StateDir holds generated files (self-signed certificate, keys).
	StateDir string `yaml:"state_dir"`
	Log      Log    `yaml:"log"`
	Admin    Admin  `yaml:"admin"`
	// TLS is the certificate every listener serves; empty means a
	// self-signed one made in StateDir on first start.
	TLS     TLS      `yaml:"tls"`
	Auth    Auth     `yaml:"auth"`
	Gateway *Gateway `yaml:"gateway"`
	Stream  *Stream  `yaml:"stream"`
	Broker  *Broker  `yaml:"broker"`
	Agent   *Agent   `yaml:"agent"`
	Web     *Web     `yaml:"web"`
	// Farm is what the gateway nodes of a farm share.
	Farm *Farm `yaml:"farm"`
}

// Farm is the state a farm's gateway nodes keep together.
type Farm struct {
	// Database is a postgres:// URL: the record of each PAA token's
	// tunnels lives there, so a token opens its one tunnel once in the
	// whole farm. Without it each node keeps its own record.
	Database Secret `yaml:"database"`
}

// Log configures log/slog.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // auto (text on a terminal, else JSON), json, text
}

// Admin is the admin listener: JSON API, /metrics and pprof.
type Admin struct {
	Listen string `yaml:"listen"`
	// Tokens are bearer tokens accepted by the admin API (/metrics is open).
	Tokens []Secret `yaml:"tokens"`
	// ConsoleTokens are the web consoles' credentials: accepted as admin
	// tokens, and the only ones whose requests may name the console user
	// they act for (Deskway-Actor) in the audit trail.
	ConsoleTokens []Secret `yaml:"console_tokens"`
}

// TLS names a certificate and key in PEM files.
type TLS struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Auth is the local user store, the token key and login throttling.
type Auth struct {
	Users []User `yaml:"users"`
	// TokenKey signs and verifies PAA tokens; every gateway of a farm and
	// the broker share it. At least 32 bytes.
	TokenKey Secret `yaml:"token_key"`
	// Domain is the NetBIOS domain name offered in NTLM challenges.
	Domain string `yaml:"domain"`
	// MaxFailures failed logins of one user from one address within
	// FailureWindow lock that pair until the window passes; as many from
	// addresses that never logged in as the user lock the user for such
	// addresses only.
	MaxFailures int `yaml:"max_failures"`
	// MaxFailuresPerAddress failed logins from one address, whatever the
	// users, lock that address (a password spray).
	MaxFailuresPerAddress int      `yaml:"max_failures_per_address"`
	FailureWindow         Duration `yaml:"failure_window"`
}

// User is a local account. NTLM needs the NT hash of the password, so either
// the password or its NT hash (32 hex digits) is given.
type User struct {
	Name     string   `yaml:"name"`
	Password Secret   `yaml:"password"`
	NTHash   Secret   `yaml:"nt_hash"`
	Groups   []string `yaml:"groups"`
	// Zone is the user's home zone: the broker prefers hosts there.
	Zone string `yaml:"zone"`
}

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
	DialTimeout  Duration `yaml:"dial_timeout"`
	// ShutdownGrace is how long open tunnels may run after SIGTERM.
	ShutdownGrace Duration `yaml:"shutdown_grace"`
	// MaxTunnels caps authorized tunnels; connections still
	// authenticating have caps of their own below, so they can never
	// lock authorized users out.
	MaxTunnels int `yaml:"max_tunnels"`
	// TokenMaxUses is how many tunnels one PAA token may open in its
	// lifetime: the first, then reconnects from the same address, never
	// two at once. 0 makes tokens bearers usable without limit, for
	// benchmarks only.
	TokenMaxUses *int `yaml:"token_max_uses"`
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
	// FarmPeers are the other nodes of a gateway farm (host:port of each
	// one's listener, as this node reaches it). A legacy IN half whose OUT
	// half went to another node behind a load balancer is carried to it.
	// Every node needs the same auth.token_key.
	FarmPeers []string `yaml:"farm_peers"`
	// ProxyProtocolFrom are the load balancers (addresses or CIDR
	// prefixes) that pass TCP through and send a PROXY protocol v2 header
	// first (HAProxy's send-proxy-v2 and check-send-proxy), naming the
	// client. Connections from them must carry one; the gateway then sees
	// the client's address for its caps, throttles and logs.
	ProxyProtocolFrom []string `yaml:"proxy_protocol_from"`
}

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

// Stream is the vDisk streaming role (NBD).
type Stream struct {
	Listen string `yaml:"listen"`
	// TLS is off, on (offered through NBD_OPT_STARTTLS) or require
	// (plain-text clients are refused).
	TLS string `yaml:"tls"`
	// Clients is how clients are admitted: certificate (the default: a
	// client certificate from deskway's CA, whose name is the only client
	// whose boots and private image it may open; TLS is then required)
	// or open (any client that reaches the port may open any export, for
	// a network where every machine is trusted).
	Clients string `yaml:"clients"`
	// Store holds write-cache overflow and private images.
	Store string `yaml:"store"`
	// CacheRAMMB is how much of each client boot's write cache stays in
	// RAM before it overflows to a sparse file in Store.
	CacheRAMMB int `yaml:"cache_ram_mb"`
	// ReconnectWindow is how long a boot's write cache outlives its last
	// connection when the client left without NBD_CMD_DISC.
	ReconnectWindow Duration `yaml:"reconnect_window"`
	// SharedCache keeps write caches as files in Store instead of RAM, so
	// that another server sharing the store can take a boot over.
	SharedCache bool `yaml:"shared_cache"`
	// MaxBoots and MaxBootsPerClient cap live boots (each holds a write
	// cache) over all clients and for one client name.
	MaxBoots          int `yaml:"max_boots"`
	MaxBootsPerClient int `yaml:"max_boots_per_client"`
	// MaxCacheMB and MaxCacheMBPerClient cap the write-cache bytes (RAM
	// and spilled, or shared-cache files) of all boots and of the boots
	// of one client name; a write past either fails as on a full disk.
	MaxCacheMB          int `yaml:"max_cache_mb"`
	MaxCacheMBPerClient int `yaml:"max_cache_mb_per_client"`
	// MaxInflight bounds the requests served at once on one connection.
	MaxInflight int `yaml:"max_inflight"`
	// MaxBufferMB bounds the bytes of requests in progress (READ replies
	// and WRITE payloads in buffers) over all connections; a connection
	// also holds at most 64 MiB. Past either, a connection's requests
	// wait until replies have gone out.
	MaxBufferMB int `yaml:"max_buffer_mb"`
	// WriteTimeout ends a connection whose client takes no byte of a
	// reply for this long.
	WriteTimeout Duration `yaml:"write_timeout"`
	// MaxUnauthenticated caps connections still negotiating (TLS, the
	// client certificate, the export): anyone who reaches the port can
	// open one, so they have a cap in all and one per source address.
	MaxUnauthenticated        int `yaml:"max_unauthenticated"`
	MaxUnauthenticatedPerAddr int `yaml:"max_unauthenticated_per_address"`
	// Trace, when set, is a file to which every request of every client
	// boot is appended as CSV (client,boot,ms,op,offset,length): the raw
	// material of the boot-storm bench's trace.
	Trace  string  `yaml:"trace"`
	VDisks []VDisk `yaml:"vdisks"`
	// Netboot, when set, serves machines with no disk: DHCP, TFTP and
	// HTTP on the boot network, and devices recognised by MAC address.
	Netboot *Netboot `yaml:"netboot"`
}

// VDisk is one streamed disk image.
type VDisk struct {
	Name        string `yaml:"name"`
	Base        string `yaml:"base"`
	Mode        string `yaml:"mode"` // standard (shared base, per-boot write cache) or private
	Description string `yaml:"description"`
	// Clients may have a private image of a private-mode vDisk made on
	// their first connection; others need one made through the admin API
	// (or, with stream.clients: certificate, a certificate naming them).
	Clients []string `yaml:"clients"`
	// Kernel and Initrd are what a network-booted device of this vDisk
	// loads (paths on this server); Cmdline is added to the kernel's
	// command line, before deskway's own parameters.
	Kernel  string `yaml:"kernel"`
	Initrd  string `yaml:"initrd"`
	Cmdline string `yaml:"cmdline"`
}

// Broker is the session broker: it places launches on session hosts and
// hands back .rdp files that route through the gateway.
type Broker struct {
	Listen string `yaml:"listen"`
	// Database is a SQLite file path (the default, in state_dir) or a
	// postgres:// URL when several brokers share state.
	Database string `yaml:"database"`
	// MaxDBConnections bounds the PostgreSQL pool; each launch in flight
	// holds one connection for one round trip.
	MaxDBConnections int `yaml:"max_db_connections"`
	// Zone is where this broker runs: launches prefer hosts in the user's
	// home zone, else in this zone, before any other.
	Zone string `yaml:"zone"`
	// MaxConcurrentLaunches caps launches in progress; more get 503 with
	// Retry-After. 0 means no cap.
	MaxConcurrentLaunches int      `yaml:"max_concurrent_launches"`
	RetryAfter            Duration `yaml:"retry_after"`
	// ReadTimeout bounds reading a whole request, headers and body: a
	// client that trickles bytes holds a connection no longer.
	ReadTimeout Duration `yaml:"read_timeout"`
	// BusyWait is how long a launch waits inside the broker, trying again,
	// when every host is only busy (at its logon limit, or taken by
	// concurrent launches) before it answers 503 with Retry-After.
	BusyWait Duration `yaml:"busy_wait"`
	// LaunchTimeout bounds one launch, database round trips included.
	LaunchTimeout Duration `yaml:"launch_timeout"`
	// HeartbeatInterval is how often agents report; a host silent for
	// HeartbeatTimeout is unreachable and gets no launches.
	HeartbeatInterval Duration `yaml:"heartbeat_interval"`
	HeartbeatTimeout  Duration `yaml:"heartbeat_timeout"`
	// LogonGrace is how long a launched session may take to appear on its
	// host before it counts as a failed logon and its slot is freed.
	LogonGrace Duration `yaml:"logon_grace"`
	// TokenTTL is how long the gateway token in a launch's .rdp file is valid.
	TokenTTL Duration `yaml:"token_ttl"`
	// Gateway is the gateway's public host:port written into .rdp files;
	// empty means gateway.public_name.
	Gateway string `yaml:"gateway"`
	// FrontendTokens let a trusted front end (a web portal, the bench)
	// launch on behalf of a user it has authenticated itself.
	FrontendTokens []Secret `yaml:"frontend_tokens"`
	// ProxyProtocolFrom are the TCP load balancers (addresses or CIDR
	// prefixes) that send a PROXY protocol v2 header first; the broker's
	// failed-login throttle and logs then see the client's address.
	ProxyProtocolFrom []string      `yaml:"proxy_protocol_from"`
	Health            Health        `yaml:"health"`
	DeliveryGroups    []DeliveryGrp `yaml:"delivery_groups"`
}

// Agent is the session-host agent: it registers this host with a broker
// and reports its load, health and sessions.
type Agent struct {
	// Broker is the broker's URL, https://host:port.
	Broker string `yaml:"broker"`
	// BrokerCA is a PEM file of the CA (or self-signed certificate) the
	// broker's certificate is checked against; empty means system roots.
	BrokerCA string `yaml:"broker_ca"`
	// JoinToken comes from deskway token join --group NAME.
	JoinToken Secret `yaml:"join_token"`
	// Name identifies the host to the broker (default: the host name).
	Name string `yaml:"name"`
	// Address and Port are where the gateway reaches the host's RDP server.
	Address      string  `yaml:"address"`
	Port         int     `yaml:"port"`
	Zone         string  `yaml:"zone"`
	Weight       float64 `yaml:"weight"`
	SessionLimit int     `yaml:"session_limit"`
	// Sessions is where sessions are read: xrdp, or none.
	Sessions string `yaml:"sessions"`
	// SessionPoll is how often sessions are checked for logons, disconnects
	// and logoffs, which are reported at once.
	SessionPoll Duration `yaml:"session_poll"`
	// DrainFile, while it exists, asks the broker for no new sessions.
	DrainFile string `yaml:"drain_file"`
}

// Health holds the thresholds past which a host takes no new sessions:
// the disk and memory ones from the Terminal Server sizing guidance, and
// CPU pressure. Read from YAML, a key left out takes its default; built
// in Go, a Health is taken as it is unless it is all zero (start from
// DefaultHealth).
type Health struct {
	DiskIdleMinPct       float64 `yaml:"disk_idle_min_pct"`
	DiskLatencyMaxMS     float64 `yaml:"disk_latency_max_ms"`
	MemoryPressureMaxPct float64 `yaml:"memory_pressure_max_pct"`
	// CPUPressureMaxPct bounds the share of time runnable tasks wait for
	// a CPU (PSI): waiting is what users feel, where CPU busy is not.
	CPUPressureMaxPct float64 `yaml:"cpu_pressure_max_pct"`
}

// DefaultHealth is the thresholds a broker uses where its config is silent.
func DefaultHealth() Health {
	return Health{DiskIdleMinPct: 50, DiskLatencyMaxMS: 25, MemoryPressureMaxPct: 20, CPUPressureMaxPct: 80}
}

// UnmarshalYAML implements yaml.Unmarshaler so that a threshold written
// down is kept even at 0 (disk_idle_min_pct: 0 turns the disk idle check
// off, as a pressure maximum of 100 does its check), and one left out
// takes its default.
func (h *Health) UnmarshalYAML(n *yaml.Node) error {
	// A map, not the struct: the decoder's strictness about unknown keys
	// does not reach into a custom unmarshaler, so the keys are checked here.
	var m map[string]float64
	if err := n.Decode(&m); err != nil {
		return err
	}
	*h = DefaultHealth()
	fields := map[string]*float64{
		"disk_idle_min_pct": &h.DiskIdleMinPct, "disk_latency_max_ms": &h.DiskLatencyMaxMS,
		"memory_pressure_max_pct": &h.MemoryPressureMaxPct, "cpu_pressure_max_pct": &h.CPUPressureMaxPct,
	}
	for k, v := range m {
		f, ok := fields[k]
		if !ok {
			return fmt.Errorf("line %d: broker.health has no key %q (it has disk_idle_min_pct, disk_latency_max_ms, memory_pressure_max_pct, cpu_pressure_max_pct)", n.Line, k)
		}
		*f = v
	}
	return nil
}

// DeliveryGrp is a delivery group: a set of hosts and who may launch on them.
type DeliveryGrp struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// TrustHostSessions lets sessions a host reports that the broker did
	// not place (users who logged on to the host directly) draw those
	// users' next launches; otherwise they only take the host's slots.
	TrustHostSessions bool `yaml:"trust_host_sessions"`
	// HostUsername is the user name an .rdp file gives the session host:
	// user (the broker's user name, right where gateway and hosts share
	// accounts, as in a Windows domain) or none (the client supplies it).
	HostUsername string `yaml:"host_username"`
	// Kind is pooled (any host) or personal (a user keeps the host of
	// their first launch).
	Kind string `yaml:"kind"`
	// Spread is breadth (least loaded first) or depth (fill a host first).
	Spread string   `yaml:"spread"`
	Users  []string `yaml:"users"`
	Groups []string `yaml:"groups"`
	// SessionLimit is the default per-host session limit; an agent may
	// register a lower one.
	SessionLimit int `yaml:"session_limit"`
	// LogonLimit is how many launches a host may have that have not yet
	// logged on (concurrent logon tolerance).
	LogonLimit int `yaml:"logon_limit"`
}

// Duration is a time.Duration written as "30s", "5m", "8h".
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (write it like 30s, 5m or 8h)", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Secret is a value that may be written inline or as env:NAME or file:PATH.
// It never prints: logging it shows REDACTED.
type Secret struct {
	ref   string
	value string
}

// UnmarshalYAML implements yaml.Unmarshaler; resolution happens in Resolve.
func (s *Secret) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: a secret is a string (inline, env:NAME or file:PATH)", n.Line)
	}
	s.ref = n.Value
	return nil
}

// MarshalYAML keeps references and hides inline values.
func (s Secret) MarshalYAML() (any, error) {
	if strings.HasPrefix(s.ref, "env:") || strings.HasPrefix(s.ref, "file:") {
		return s.ref, nil
	}
	if s.ref == "" {
		return "", nil
	}
	return "REDACTED", nil
}

// NewSecret returns a resolved secret holding v.
func NewSecret(v string) Secret { return Secret{ref: v, value: v} }

// Resolve reads env: and file: references.
func (s *Secret) Resolve() error {
	switch {
	case strings.HasPrefix(s.ref, "env:"):
		name := strings.TrimPrefix(s.ref, "env:")
		v, ok := os.LookupEnv(name)
		if !ok {
			return fmt.Errorf("environment variable %s is not set", name)
		}
		s.value = v
	case strings.HasPrefix(s.ref, "file:"):
		path := strings.TrimPrefix(s.ref, "file:")
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read secret file: %w", err)
		}
		s.value = strings.TrimRight(string(b), "\r\n")
	default:
		s.value = s.ref
	}
	return nil
}

// Value returns the resolved secret.
func (s Secret) Value() string { return s.value }

// IsSet reports whether anything was configured.
func (s Secret) IsSet() bool { return s.ref != "" }

// String hides the value.
func (s Secret) String() string { return "REDACTED" }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue("REDACTED") }

// Load reads, decodes, defaults, resolves and validates the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes YAML strictly, applies defaults, resolves secrets and validates.
func Parse(b []byte) (*Config, error) {
	c := &Config{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	c.ApplyDefaults()
	if err := c.resolveSecrets(); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) resolveSecrets() error {
	for i := range c.Admin.Tokens {
		if err := c.Admin.Tokens[i].Resolve(); err != nil {
			return fmt.Errorf("admin.tokens[%d]: %w", i, err)
		}
	}
	for i := range c.Admin.ConsoleTokens {
		if err := c.Admin.ConsoleTokens[i].Resolve(); err != nil {
			return fmt.Errorf("admin.console_tokens[%d]: %w", i, err)
		}
	}
	if err := c.Auth.TokenKey.Resolve(); err != nil {
		return fmt.Errorf("auth.token_key: %w", err)
	}
	for i := range c.Auth.Users {
		u := &c.Auth.Users[i]
		if err := u.Password.Resolve(); err != nil {
			return fmt.Errorf("auth.users[%d] (%s).password: %w", i, u.Name, err)
		}
		if err := u.NTHash.Resolve(); err != nil {
			return fmt.Errorf("auth.users[%d] (%s).nt_hash: %w", i, u.Name, err)
		}
	}
	if c.Agent != nil {
		if err := c.Agent.JoinToken.Resolve(); err != nil {
			return fmt.Errorf("agent.join_token: %w", err)
		}
	}
	if c.Broker != nil {
		for i := range c.Broker.FrontendTokens {
			if err := c.Broker.FrontendTokens[i].Resolve(); err != nil {
				return fmt.Errorf("broker.frontend_tokens[%d]: %w", i, err)
			}
		}
	}
	if c.Web != nil {
		// web.frontend_token may be a copy of broker.frontend_tokens[0],
		// made before either was resolved.
		if err := c.Web.FrontendToken.Resolve(); err != nil {
			return fmt.Errorf("web.frontend_token: %w", err)
		}
		if err := c.Web.CookieKey.Resolve(); err != nil {
			return fmt.Errorf("web.cookie_key: %w", err)
		}
		if c.Web.OIDC != nil {
			if err := c.Web.OIDC.ClientSecret.Resolve(); err != nil {
				return fmt.Errorf("web.oidc.client_secret: %w", err)
			}
		}
		if c.Web.Console != nil {
			if err := c.Web.Console.Token.Resolve(); err != nil {
				return fmt.Errorf("web.console.token: %w", err)
			}
		}
		if c.Web.LDAP != nil {
			if err := c.Web.LDAP.BindPassword.Resolve(); err != nil {
				return fmt.Errorf("web.ldap.bind_password: %w", err)
			}
		}
	}
	if c.Gateway != nil && c.Gateway.RADIUS != nil {
		if err := c.Gateway.RADIUS.Secret.Resolve(); err != nil {
			return fmt.Errorf("gateway.radius.secret: %w", err)
		}
	}
	if c.Farm != nil {
		if err := c.Farm.Database.Resolve(); err != nil {
			return fmt.Errorf("farm.database: %w", err)
		}
	}
	return nil
}

// ApplyDefaults fills every unset field with its default.
func (c *Config) ApplyDefaults() {
	setDefault(&c.StateDir, "/var/lib/deskway")
	setDefault(&c.Log.Level, "info")
	setDefault(&c.Log.Format, "auto")
	setDefault(&c.Admin.Listen, "127.0.0.1:9443")
	setDefault(&c.Auth.Domain, "DESKWAY")
	setDefault(&c.Auth.MaxFailures, 5)
	setDefault(&c.Auth.MaxFailuresPerAddress, 20)
	setDefault(&c.Auth.FailureWindow, Duration(5*time.Minute))
	if st := c.Stream; st != nil {
		setDefault(&st.Listen, ":10809")
		setDefault(&st.TLS, "on")
		setDefault(&st.Clients, "certificate")
		setDefault(&st.Store, c.StateDir+"/vdisks")
		setDefault(&st.CacheRAMMB, 64)
		setDefault(&st.ReconnectWindow, Duration(2*time.Minute))
		setDefault(&st.MaxInflight, 16)
		setDefault(&st.MaxBufferMB, 1024)
		setDefault(&st.MaxBoots, 2000)
		setDefault(&st.MaxBootsPerClient, 4)
		setDefault(&st.MaxCacheMB, 256<<10)
		setDefault(&st.MaxCacheMBPerClient, 16<<10)
		setDefault(&st.WriteTimeout, Duration(60*time.Second))
		setDefault(&st.MaxUnauthenticated, 2048)
		setDefault(&st.MaxUnauthenticatedPerAddr, 64)
		for i := range st.VDisks {
			setDefault(&st.VDisks[i].Mode, "standard")
		}
		if st.Netboot != nil {
			netbootDefaults(st.Netboot)
		}
	}
	if b := c.Broker; b != nil {
		c.brokerDefaults(b)
	}
	if a := c.Agent; a != nil {
		c.agentDefaults(a)
	}
	if w := c.Web; w != nil {
		c.webDefaults(w)
	}
	if g := c.Gateway; g != nil {
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
			one := 1
			g.TokenMaxUses = &one
		}
		setDefault(&g.DialTimeout, Duration(10*time.Second))
		setDefault(&g.ShutdownGrace, Duration(30*time.Second))
		setDefault(&g.MaxTunnels, 20000)
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
}

// Validate checks the decoded, defaulted config and names the key at fault.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, a...)))
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "auto", "json", "text":
	default:
		bad("log.format", "%q is not one of auto, json, text", c.Log.Format)
	}
	if _, _, err := net.SplitHostPort(c.Admin.Listen); err != nil {
		bad("admin.listen", "%q is not host:port", c.Admin.Listen)
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		bad("tls", "give both cert and key, or neither for a self-signed certificate")
	}
	if c.Auth.TokenKey.IsSet() && len(c.Auth.TokenKey.Value()) < 32 {
		bad("auth.token_key", "is %d bytes; use at least 32 random bytes", len(c.Auth.TokenKey.Value()))
	}
	if c.Auth.MaxFailures < 1 {
		bad("auth.max_failures", "must be at least 1")
	}
	seen := map[string]bool{}
	for i, u := range c.Auth.Users {
		key := fmt.Sprintf("auth.users[%d]", i)
		if u.Name == "" || strings.ContainsAny(u.Name, `\@/ `) {
			bad(key+".name", "%q is empty or has one of \\ @ / or a space", u.Name)
		}
		if seen[strings.ToLower(u.Name)] {
			bad(key+".name", "%q appears twice", u.Name)
		}
		seen[strings.ToLower(u.Name)] = true
		if u.Password.IsSet() == u.NTHash.IsSet() {
			bad(key, "user %q needs exactly one of password or nt_hash", u.Name)
		}
		if u.NTHash.IsSet() && !isHex(u.NTHash.Value(), 32) {
			bad(key+".nt_hash", "must be 32 hex digits")
		}
	}
	if g := c.Gateway; g != nil {
		c.validateGateway(g, bad)
	}
	if st := c.Stream; st != nil {
		validateStream(st, bad)
	}
	if b := c.Broker; b != nil {
		c.validateBroker(b, bad)
	}
	if a := c.Agent; a != nil {
		validateAgent(a, bad)
	}
	c.validateAdminConsoleTokens(bad)
	if w := c.Web; w != nil {
		c.validateWeb(w, bad)
	}
	return errors.Join(errs...)
}

func (c *Config) validateGateway(g *Gateway, bad func(string, string, ...any)) {
	if _, _, err := net.SplitHostPort(g.Listen); err != nil {
		bad("gateway.listen", "%q is not host:port", g.Listen)
	}
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
	if _, err := ParsePrefixes(g.ProxyProtocolFrom); err != nil {
		bad("gateway.proxy_protocol_from", "%v", err)
	}
	for i, peer := range g.FarmPeers {
		if h, port, err := net.SplitHostPort(peer); err != nil || h == "" || port == "" {
			bad(fmt.Sprintf("gateway.farm_peers[%d]", i), "%q is not host:port", peer)
		}
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
		for _, h := range p.Hosts {
			if strings.Contains(h, "/") {
				if _, err := netip.ParsePrefix(h); err != nil {
					bad(key+".hosts", "%q is not a CIDR prefix: %v", h, err)
				}
			}
		}
		for _, port := range p.Ports {
			if port < 1 || port > 65535 {
				bad(key+".ports", "%d is not a TCP port", port)
			}
		}
		for _, pin := range p.HostCertSHA256 {
			if _, err := ParseCertPin(pin); err != nil {
				bad(key+".host_certificate_sha256", "%v", err)
			}
		}
	}
	for _, o := range g.BrowserOrigins {
		if u, err := url.Parse(o); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Path != "" || u.RawQuery != "" {
			bad("gateway.browser_origins", "%q is not an origin such as https://portal.example.com", o)
		}
	}
	if r := g.RADIUS; r != nil {
		if _, _, err := net.SplitHostPort(r.Server); err != nil {
			bad("gateway.radius.server", "%q is not host:port", r.Server)
		}
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

func validateStream(st *Stream, bad func(string, string, ...any)) {
	if _, _, err := net.SplitHostPort(st.Listen); err != nil {
		bad("stream.listen", "%q is not host:port", st.Listen)
	}
	switch st.TLS {
	case "off", "on", "require":
	default:
		bad("stream.tls", "%q is not one of off, on, require", st.TLS)
	}
	switch st.Clients {
	case "open":
	case "certificate":
		if st.TLS == "off" {
			bad("stream.clients", "certificate needs TLS: set stream.tls to on or require, or stream.clients to open on a trusted network")
		}
	default:
		bad("stream.clients", "%q is not certificate or open", st.Clients)
	}
	if st.CacheRAMMB < 0 {
		bad("stream.cache_ram_mb", "must not be negative")
	}
	if st.MaxUnauthenticated < 1 || st.MaxUnauthenticatedPerAddr < 1 || st.MaxUnauthenticatedPerAddr > st.MaxUnauthenticated {
		bad("stream.max_unauthenticated_per_address", "caps must be at least 1, the per-address one at most max_unauthenticated (%d)", st.MaxUnauthenticated)
	}
	if st.MaxBoots < 1 || st.MaxBootsPerClient < 1 {
		bad("stream.max_boots", "max_boots and max_boots_per_client must be at least 1")
	}
	if st.MaxCacheMB < 1 || st.MaxCacheMBPerClient < 1 {
		bad("stream.max_cache_mb", "max_cache_mb and max_cache_mb_per_client must be at least 1 (MiB)")
	}
	if st.MaxBufferMB < 64 {
		bad("stream.max_buffer_mb", "must be at least 64 (two requests of the 32 MiB maximum)")
	}
	if st.WriteTimeout.D() < time.Second {
		bad("stream.write_timeout", "must be at least 1s")
	}
	if st.MaxInflight < 1 || st.MaxInflight > 1024 {
		bad("stream.max_inflight", "must be between 1 and 1024")
	}
	if len(st.VDisks) == 0 {
		bad("stream.vdisks", "list at least one vDisk (name, base)")
	}
	seen := map[string]bool{}
	for i, v := range st.VDisks {
		key := fmt.Sprintf("stream.vdisks[%d]", i)
		uniqueName(bad, key+".name", v.Name, seen)
		if v.Base == "" {
			bad(key+".base", "give the path of the base image")
		} else if fi, err := os.Stat(v.Base); err != nil {
			bad(key+".base", "%v", err)
		} else if !fi.Mode().IsRegular() {
			bad(key+".base", "%s is not a regular file", v.Base)
		}
		switch v.Mode {
		case "standard":
		case "private":
		default:
			bad(key+".mode", "%q is not standard or private", v.Mode)
		}
	}
	if st.Netboot != nil {
		validateNetboot(st.Netboot, st, bad)
	}
}

// uniqueName checks the name of a list entry: not empty, no slash or
// space (names appear in URLs and export names), and not used before.
func uniqueName(bad func(string, string, ...any), key, name string, seen map[string]bool) {
	if name == "" || strings.ContainsAny(name, "/ ") {
		bad(key, "%q is empty or has a / or a space", name)
	}
	if seen[name] {
		bad(key, "%q appears twice", name)
	}
	seen[name] = true
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			return false
		}
	}
	return true
}

// setDefault gives a setting its default when the file left it unset
// (its zero value).
func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// ParsePrefixes reads addresses and CIDR prefixes; an address is a prefix
// of its full length.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		if p, err := netip.ParsePrefix(s); err == nil {
			// Connections' addresses are compared unmapped: so is an
			// IPv4-mapped prefix.
			if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not an address or a CIDR prefix", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}
