package config

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

func (c *Config) brokerDefaults(b *Broker) {
	setDefault(&b.Listen, ":8444")
	setDefault(&b.Database, filepath.Join(c.StateDir, "broker.db"))
	setDefault(&b.MaxDBConnections, 64)
	setDefault(&b.RetryAfter, Duration(time.Second))
	setDefault(&b.ReadTimeout, Duration(30*time.Second))
	setDefault(&b.BusyWait, Duration(2*time.Second))
	setDefault(&b.LaunchTimeout, Duration(30*time.Second))
	setDefault(&b.HeartbeatInterval, Duration(5*time.Second))
	setDefault(&b.HeartbeatTimeout, Duration(30*time.Second))
	setDefault(&b.LogonGrace, Duration(2*time.Minute))
	setDefault(&b.TokenTTL, Duration(5*time.Minute))
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
	if _, _, err := net.SplitHostPort(b.Listen); err != nil {
		bad("broker.listen", "%q is not host:port", b.Listen)
	}
	if _, err := ParsePrefixes(b.ProxyProtocolFrom); err != nil {
		bad("broker.proxy_protocol_from", "%v", err)
	}
	if !c.Auth.TokenKey.IsSet() {
		bad("auth.token_key", "the broker signs gateway tokens and agent credentials with it: set 32 or more random bytes")
	}
	if b.Gateway == "" {
		bad("broker.gateway", "set the gateway's public host:port for .rdp files (or add a gateway section with public_name)")
	}
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

func (c *Config) agentDefaults(a *Agent) {
	host, _ := os.Hostname()
	setDefault(&a.Name, host)
	setDefault(&a.Address, host)
	setDefault(&a.Port, 3389)
	setDefault(&a.Sessions, "xrdp")
	setDefault(&a.SessionPoll, Duration(time.Second))
	setDefault(&a.DrainFile, filepath.Join(c.StateDir, "agent.drain"))
}

func validateAgent(a *Agent, bad func(string, string, ...any)) {
	u, err := url.Parse(a.Broker)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		bad("agent.broker", "%q is not an https://host:port URL of a broker", a.Broker)
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
