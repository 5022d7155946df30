package config

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.yaml.in/yaml/v3"
)

// Broker is the session broker: it places launches on session hosts and
// hands back .rdp files that route through the gateway.
type Broker struct {
	Listen string `yaml:"listen"`
	// Database is a SQLite file path (the default, in state_dir) or a
	// postgres:// URL when several brokers share state; it may be an
	// env: or file: reference, as a URL with a password often is.
	Database DatabaseURL `yaml:"database"`
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
	ProxyProtocolFrom []string `yaml:"proxy_protocol_from"`
	// Peers are the other brokers on the same PostgreSQL database, as
	// https://host:port URLs. While the database is unreachable, a launch
	// for a user this broker's local host cache has no session of asks
	// them first whether they hold one, placed or reported to them since
	// the database went away, and reconnects to it if so.
	Peers []string `yaml:"peers"`
	// PeerCA is the PEM file the peers' certificates are checked against;
	// empty means this deskway's own certificate (brokers behind one
	// balancer usually share it).
	PeerCA string `yaml:"peer_ca"`
	// PeerServerName is the name the peers' certificates must hold, in
	// place of each peer URL's host: brokers that share one certificate,
	// made for the name their balancer or Service has, are reached at
	// addresses of their own it does not name.
	PeerServerName string `yaml:"peer_server_name"`
	// PeerTimeout bounds the question to the peers: one that does not
	// answer in time is taken to hold nothing.
	PeerTimeout    Duration      `yaml:"peer_timeout"`
	Health         Health        `yaml:"health"`
	DeliveryGroups []DeliveryGrp `yaml:"delivery_groups"`
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
	// does not reach into a custom unmarshaler. Parse's shape check has
	// refused unknown keys already; this keeps any other decoding strict.
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

func (c *Config) brokerDefaults(b *Broker) {
	setDefault(&b.Listen, ":8444")
	if !b.Database.IsSet() {
		b.Database = NewDatabaseURL(filepath.Join(c.StateDir, "broker.db"))
	}
	setDefault(&b.MaxDBConnections, 64)
	setDefault(&b.RetryAfter, Duration(time.Second))
	setDefault(&b.ReadTimeout, Duration(30*time.Second))
	setDefault(&b.BusyWait, Duration(2*time.Second))
	setDefault(&b.LaunchTimeout, Duration(30*time.Second))
	setDefault(&b.HeartbeatInterval, Duration(5*time.Second))
	setDefault(&b.HeartbeatTimeout, Duration(30*time.Second))
	setDefault(&b.LogonGrace, Duration(2*time.Minute))
	setDefault(&b.TokenTTL, Duration(5*time.Minute))
	setDefault(&b.PeerTimeout, Duration(time.Second))
	if b.Gateway == "" && c.Gateway != nil {
		b.Gateway = c.Gateway.PublicName
	}
	// All zero is no health section at all: a written one has its
	// defaults from UnmarshalYAML, and a latency maximum of 0 is no config
	// anyone means.
	if b.Health == (Health{}) {
		b.Health = DefaultHealth()
	}
	for i := range b.DeliveryGroups {
		g := &b.DeliveryGroups[i]
		setDefault(&g.Kind, "pooled")
		setDefault(&g.Spread, "breadth")
		setDefault(&g.SessionLimit, 50)
		setDefault(&g.LogonLimit, 2)
		setDefault(&g.HostUsername, "user")
	}
}

func (c *Config) validateBroker(b *Broker, bad func(string, string, ...any)) {
	checkListen(bad, "broker.listen", b.Listen)
	checkBalancers(bad, "broker.proxy_protocol_from", b.ProxyProtocolFrom)
	checkDatabase(bad, "broker.database", b.Database)
	if !c.Auth.TokenKey.IsSet() {
		bad("auth.token_key", "the broker signs gateway tokens and agent credentials with it: set 32 or more random bytes")
	}
	if b.Gateway == "" {
		bad("broker.gateway", "set the gateway's public host:port for .rdp files (or add a gateway section with public_name)")
	} else {
		checkHostOptionalPort(bad, "broker.gateway", b.Gateway)
	}
	c.checkPeers(b, bad)
	if b.MaxConcurrentLaunches < 0 {
		bad("broker.max_concurrent_launches", "must be 0 (no cap) or more")
	}
	if b.BusyWait.D() >= b.LaunchTimeout.D() {
		bad("broker.busy_wait", "%s must be shorter than launch_timeout %s", b.BusyWait.D(), b.LaunchTimeout.D())
	}
	if b.MaxDBConnections < 1 {
		bad("broker.max_db_connections", "must be at least 1")
	}
	if b.HeartbeatTimeout.D() <= b.HeartbeatInterval.D() {
		bad("broker.heartbeat_timeout", "%s must exceed heartbeat_interval %s", b.HeartbeatTimeout.D(), b.HeartbeatInterval.D())
	}
	for _, h := range []struct {
		key string
		v   float64
	}{{"disk_idle_min_pct", b.Health.DiskIdleMinPct}, {"memory_pressure_max_pct", b.Health.MemoryPressureMaxPct},
		{"cpu_pressure_max_pct", b.Health.CPUPressureMaxPct}} {
		if h.v < 0 || h.v > 100 {
			bad("broker.health."+h.key, "%g is not a percentage", h.v)
		}
	}
	if len(b.DeliveryGroups) == 0 {
		bad("broker.delivery_groups", "define at least one delivery group (name, users or groups)")
	}
	seen := map[string]bool{}
	for i, g := range b.DeliveryGroups {
		key := fmt.Sprintf("broker.delivery_groups[%d]", i)
		uniqueName(bad, key+".name", g.Name, seen)
		if g.Kind != "pooled" && g.Kind != "personal" {
			bad(key+".kind", "%q is not pooled or personal", g.Kind)
		}
		if g.Spread != "breadth" && g.Spread != "depth" {
			bad(key+".spread", "%q is not breadth or depth", g.Spread)
		}
		if g.HostUsername != "user" && g.HostUsername != "none" {
			bad(key+".host_username", "%q is not user or none", g.HostUsername)
		}
		if len(g.Users) == 0 && len(g.Groups) == 0 {
			bad(key, "group %q entitles nobody: list users or groups", g.Name)
		}
		if g.SessionLimit < 1 || g.LogonLimit < 1 {
			bad(key, "session_limit and logon_limit must be at least 1")
		}
	}
}

// checkPeers checks broker.peers and what goes with it.
func (c *Config) checkPeers(b *Broker, bad func(string, string, ...any)) {
	seen := map[string]bool{}
	for i, p := range b.Peers {
		key := fmt.Sprintf("broker.peers[%d]", i)
		u, err := url.Parse(p)
		if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			bad(key, "%q is not an https://host:port URL of another broker", p)
			continue
		}
		checkURLHost(bad, key, p)
		if seen[u.Host] {
			bad(key, "%q is listed twice", p)
		}
		seen[u.Host] = true
	}
	if v := b.Database.Value(); len(b.Peers) > 0 && v != "" && !isPostgres(v) {
		bad("broker.peers", "peers are brokers sharing one PostgreSQL database; broker.database is a SQLite file, which one broker alone may use")
	}
	c.checkCAFile(bad, "broker.peer_ca", b.PeerCA)
	if p := hostProblem(b.PeerServerName); b.PeerServerName != "" && p != "" {
		bad("broker.peer_server_name", "%s", p)
	}
	if b.PeerTimeout.D() <= 0 || b.PeerTimeout.D() >= b.LaunchTimeout.D() {
		bad("broker.peer_timeout", "%s must be more than 0 and shorter than launch_timeout %s", b.PeerTimeout.D(), b.LaunchTimeout.D())
	}
}

func (c *Config) agentDefaults(a *Agent) {
	host, _ := os.Hostname()
	setDefault(&a.Name, host)
	setDefault(&a.Address, host)
	setDefault(&a.Port, 3389)
	setDefault(&a.Sessions, "xrdp")
	setDefault(&a.SessionPoll, Duration(time.Second))
	setDefault(&a.DrainFile, filepath.Join(c.StateDir, "agent.drain"))
}

func (c *Config) validateAgent(a *Agent, bad func(string, string, ...any)) {
	u, err := url.Parse(a.Broker)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		bad("agent.broker", "%q is not an https://host:port URL of a broker", a.Broker)
	} else {
		checkURLHost(bad, "agent.broker", a.Broker)
	}
	c.checkCAFile(bad, "agent.broker_ca", a.BrokerCA)
	// The default, the host name, is the system's business.
	if p := hostProblem(a.Address); c.src.has("agent.address") && p != "" {
		bad("agent.address", "%s", p)
	}
	if !a.JoinToken.IsSet() {
		bad("agent.join_token", "set the join token from deskway token join --group NAME")
	}
	if a.Port < 1 || a.Port > 65535 {
		bad("agent.port", "%d is not 1 to 65535", a.Port)
	}
	if a.Sessions != "xrdp" && a.Sessions != "none" {
		bad("agent.sessions", "%q is not xrdp or none", a.Sessions)
	}
	if a.Weight < 0 || a.SessionLimit < 0 {
		bad("agent", "weight and session_limit must not be negative")
	}
}
