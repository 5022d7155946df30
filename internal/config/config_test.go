package config

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEmptyIsDefaults(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Admin.Listen != "127.0.0.1:9443" || c.Gateway != nil {
		t.Fatalf("defaults wrong: %+v", c)
	}
	g, err := Parse([]byte("gateway:\n  listen: \":1\"\n  auth_methods: [ntlm]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if g.Gateway.ReconnectWindowD() != 10*time.Minute {
		t.Fatalf("gateway.reconnect_window defaults to %s, want 10m", g.Gateway.ReconnectWindowD())
	}
	z, err := Parse([]byte("gateway:\n  listen: \":1\"\n  auth_methods: [ntlm]\n  reconnect_window: 0s\n"))
	if err != nil || z.Gateway.ReconnectWindowD() != 0 {
		t.Fatalf("gateway.reconnect_window 0 (off) not kept: %v", err)
	}
}

func TestUnknownKeyNamesKeyAndLine(t *testing.T) {
	_, err := Parse([]byte("log:\n  level: info\ngateway:\n  listen: :8443\n  idle_timout: 5m\n"))
	if err == nil || !strings.Contains(err.Error(), "line 5") || !strings.Contains(err.Error(), "idle_timout") {
		t.Fatalf("want error naming idle_timout at line 5, got %v", err)
	}
}

func TestValidationNamesKey(t *testing.T) {
	cases := map[string]string{
		"log:\n  level: loud\n":                            "log.level",
		"gateway:\n  auth_methods: [paa]\n":                "paa needs auth.token_key",
		"auth:\n  token_key: short\n":                      "auth.token_key",
		"auth:\n  users:\n  - name: a\n":                   "exactly one of password or nt_hash",
		"auth:\n  users:\n  - name: a\n    nt_hash: xyz\n": "nt_hash",
		"gateway:\n  idle_timeout: soon\n":                 `gateway.idle_timeout (line 2): want a duration like 30s, 5m or 8h, got "soon"`,
		"gateway:\n  resource_policies:\n  - name: r\n    groups: [g]\n    hosts: [10.0.0.0/33]\n": "CIDR",
		"gateway:\n  connection_policies:\n  - name: c\n":                                          "match nobody",
		"gateway:\n  auth_methods: [ntlm]\n  radius:\n    server: nowhere\n    secret: s\n":        "gateway.radius.server",
		"gateway:\n  browser_compression: gzip\n":                                                  `gateway.browser_compression (line 2): "gzip" is not off, no_context_takeover or context_takeover`,
		"gateway:\n  browser_logon_timeout: 500ms\n":                                               `gateway.browser_logon_timeout (line 2): must be between 1s and 10m`,
		"gateway:\n  reconnect_window: 25h\n":                                                      `gateway.reconnect_window (line 2): must be 0 (no reconnect once a token expired) to 24h`,
		"gateway:\n  reconnect_window: -1s\n":                                                      `gateway.reconnect_window (line 2): must be 0`,
	}
	for in, want := range cases {
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: want error containing %q, got %v", in, want, err)
		}
	}
}

func TestSecrets(t *testing.T) {
	t.Setenv("DW_TEST_KEY", strings.Repeat("k", 40))
	c, err := Parse([]byte("auth:\n  token_key: env:DW_TEST_KEY\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Auth.TokenKey.Value() != strings.Repeat("k", 40) {
		t.Fatal("env secret not resolved")
	}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "key", c.Auth.TokenKey)
	if strings.Contains(buf.String(), "kkkk") || !strings.Contains(buf.String(), "REDACTED") {
		t.Fatalf("secret leaked into log: %s", buf.String())
	}
	if s := fmt.Sprint(c.Auth.TokenKey); s != "REDACTED" {
		t.Fatalf("secret printed as %q", s)
	}
	if _, err := Parse([]byte("auth:\n  token_key: env:DW_NOT_SET_ANYWHERE\n")); err == nil || !strings.Contains(err.Error(), "DW_NOT_SET_ANYWHERE") {
		t.Fatalf("missing env var not reported: %v", err)
	}
}

func TestBrokerAndAgentValidation(t *testing.T) {
	const key = "auth:\n  token_key: 0123456789abcdef0123456789abcdef\n"
	ok := key + "broker:\n  gateway: gw:443\n  delivery_groups:\n  - {name: desk, groups: [staff]}\n"
	c, err := Parse([]byte(ok))
	if err != nil {
		t.Fatalf("valid broker config refused: %v", err)
	}
	g := c.Broker.DeliveryGroups[0]
	if c.Broker.Listen != ":8444" || g.Kind != "pooled" || g.Spread != "breadth" || g.SessionLimit != 50 || g.LogonLimit != 2 ||
		c.Broker.Health.DiskLatencyMaxMS != 25 || c.Broker.Health.DiskIdleMinPct != 50 || !strings.HasSuffix(c.Broker.Database.Value(), "broker.db") {
		t.Fatalf("broker defaults: %+v", c.Broker)
	}
	cases := map[string]string{
		"broker:\n  gateway: gw:443\n  delivery_groups:\n  - {name: desk, groups: [g]}\n":                                           "auth.token_key",
		key + "broker:\n  delivery_groups:\n  - {name: desk, groups: [g]}\n":                                                        "broker.gateway",
		key + "broker:\n  gateway: gw:443\n":                                                                                        "at least one delivery group",
		key + "broker:\n  gateway: gw:443\n  delivery_groups:\n  - {name: desk}\n":                                                  "entitles nobody",
		key + "broker:\n  gateway: gw:443\n  delivery_groups:\n  - {name: desk, kind: shared, groups: [g]}\n":                       "broker.delivery_groups[0].kind",
		key + "broker:\n  gateway: gw:443\n  delivery_groups:\n  - {name: d, groups: [g]}\n  - {name: d, groups: [g]}\n":            "appears twice",
		key + "broker:\n  gateway: gw:443\n  heartbeat_timeout: 1s\n  delivery_groups:\n  - {name: desk, groups: [g]}\n":            "broker.heartbeat_timeout",
		key + "broker:\n  gateway: gw:443\n  health: {disk_idle_min_pct: 150}\n  delivery_groups:\n  - {name: desk, groups: [g]}\n": "not a percentage",
		"agent:\n  broker: http://b:8444\n  join_token: x\n":                                                                        "agent.broker",
		"agent:\n  broker: https://b:8444\n":                                                                                        "agent.join_token",
		"agent:\n  broker: https://b:8444\n  join_token: x\n  sessions: wtmp\n":                                                     "agent.sessions",
	}
	for in, want := range cases {
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: got %v, want an error with %q", in, err, want)
		}
	}
}

// TestWebLocalBroker: a portal whose broker is left empty uses this
// config's, which a process running both may call directly; one that
// names a broker keeps it.
func TestWebLocalBroker(t *testing.T) {
	const base = "auth:\n  token_key: 0123456789abcdef0123456789abcdef\nbroker:\n  listen: \":9444\"\n  gateway: gw:443\n  frontend_tokens: [ft-0123456789]\n  delivery_groups:\n  - {name: desk, groups: [staff]}\n"
	c, err := Parse([]byte(base + "web:\n  listen: \":8446\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Web.Broker != "https://127.0.0.1:9444" || !c.Web.LocalBroker() {
		t.Fatalf("empty web.broker: %q, local %v", c.Web.Broker, c.Web.LocalBroker())
	}
	c, err = Parse([]byte(base + "web:\n  listen: \":8446\"\n  broker: https://broker.example:8444\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Web.Broker != "https://broker.example:8444" || c.Web.LocalBroker() {
		t.Fatalf("named web.broker: %q, local %v", c.Web.Broker, c.Web.LocalBroker())
	}
}

// TestNetbootValidation: the boot services' settings are checked, with
// the key and what to do.
func TestNetbootValidation(t *testing.T) {
	img := filepath.Join(t.TempDir(), "golden.img")
	os.WriteFile(img, nil, 0o600)
	base := "stream:\n  listen: \"10.77.0.1:10809\"\n  tls: \"off\"\n  clients: open\n  vdisks:\n  - {name: golden, base: " + img + "}\n  netboot:\n"
	c, err := Parse([]byte(base + "    interface: br0\n    address: 10.77.0.1\n    dhcp: full\n    pool: {start: 10.77.0.100, end: 10.77.0.150}\n"))
	if err != nil {
		t.Fatalf("valid netboot config refused: %v", err)
	}
	if n := c.Stream.Netboot; n.HTTPPort != 8069 || n.IPXEDir != "/usr/lib/ipxe" || n.Pool.Netmask != "255.255.255.0" || n.Pool.Lease.D() != time.Hour || !*n.RouterAdvertisements {
		t.Fatalf("netboot defaults: %+v %+v", n, n.Pool)
	}
	// A proxy's network has its own routers: no advertisements unless asked.
	for in, want := range map[string]bool{"": false, "    router_advertisements: true\n": true} {
		c, err := Parse([]byte(base + "    interface: br0\n    address: 10.77.0.1\n" + in))
		if err != nil {
			t.Fatalf("proxy with %q: %v", in, err)
		}
		if got := *c.Stream.Netboot.RouterAdvertisements; got != want {
			t.Errorf("proxy with %q: router_advertisements %v, want %v", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"    address: 10.77.0.1\n":                                                                                           "stream.netboot.interface",
		"    interface: br0\n    address: fe80::1\n":                                                                         "stream.netboot.address",
		"    interface: br0\n    address: 10.77.0.1\n    dhcp: full\n":                                                       "give pool.start and pool.end",
		"    interface: br0\n    address: 10.77.0.1\n    pool: {start: 10.77.0.2, end: 10.77.0.3}\n":                         "is for dhcp: full",
		"    interface: br0\n    address: 10.77.0.1\n    dhcp: full\n    pool: {start: 10.77.1.2, end: 10.77.1.3}\n":         "is not in 10.77.0.0/24",
		"    interface: br0\n    address: 10.77.0.1\n    dhcp: full\n    pool: {start: 10.77.0.1, end: 10.77.0.3}\n":         "the server's own address",
		"    interface: br0\n    address: 10.77.0.1\n    dhcp: relay\n":                                                      "not proxy or full",
		"    interface: br0\n    address: 10.77.0.9\n":                                                                       "devices could not reach it",
		"    interface: br0\n    address: 10.77.0.1\n    servers: [\"10.77.0.1:10809\", \"10.77.0.2:10809\"]\n":              "set stream.shared_cache",
		"    interface: br0\n    address: 10.77.0.1\n    secure_boot: true\n    shim: /nonexistent/shimx64.efi\n":            "/nonexistent/shimx64.efi is not a readable file: secure_boot needs Debian's shim-signed package",
		"    interface: br0\n    address: 10.77.0.1\n    secure_boot: true\n    shim: " + img + "\n    grub: /nonexistent\n": "/nonexistent is not a readable file: secure_boot needs Debian's grub-efi-amd64-signed",
	} {
		if _, err := Parse([]byte(base + in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("netboot %q: got %v, want an error with %q", in, err, want)
		}
	}
	cert := strings.Replace(base, "clients: open", "clients: certificate", 1)
	cert = strings.Replace(cert, `tls: "off"`, "tls: require", 1)
	if _, err := Parse([]byte(cert + "    interface: br0\n    address: 10.77.0.1\n")); err == nil || !strings.Contains(err.Error(), "stream.clients: open") {
		t.Errorf("netboot with client certificates: %v", err)
	}
}

// TestFarmDatabase: farm.database is a secret (it carries a password),
// read from a file like any other, and must be a PostgreSQL URL.
func TestFarmDatabase(t *testing.T) {
	f := filepath.Join(t.TempDir(), "farm-db")
	if err := os.WriteFile(f, []byte("postgres://gw:pw@db/farm\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "auth:\n  token_key: " + strings.Repeat("k", 32) + "\ngateway:\n  connection_policies: [{name: a, users: [\"*\"]}]\n  resource_policies: [{name: r, users: [\"*\"], hosts: [127.0.0.1]}]\n"
	c, err := Parse([]byte(base + "farm:\n  database: file:" + f + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Farm.Database.Value() != "postgres://gw:pw@db/farm" {
		t.Fatalf("farm.database resolved to %q", c.Farm.Database.Value())
	}
	if _, err := Parse([]byte(base + "farm:\n  database: /var/lib/farm.db\n")); err == nil || !strings.Contains(err.Error(), "farm.database") {
		t.Fatalf("a farm.database that is not a PostgreSQL URL: %v", err)
	}
	if _, err := Parse([]byte(base + "  proxy_protocol_from: [\"::ffff:10.0.0.0/104\", 10.1.0.5, nonsense]\n")); err == nil || !strings.Contains(err.Error(), "gateway.proxy_protocol_from") {
		t.Fatalf("a proxy_protocol_from entry that is no address: %v", err)
	}
	p, err := ParsePrefixes([]string{"::ffff:10.0.0.0/104", "10.1.0.5"})
	if err != nil || p[0].String() != "10.0.0.0/8" || p[1].String() != "10.1.0.5/32" {
		t.Fatalf("prefixes %v, %v", p, err)
	}
}

// TestCPUPressureThreshold: broker.health.cpu_pressure_max_pct defaults to
// 80, keeps a value set, and is a percentage like the other thresholds.
func TestCPUPressureThreshold(t *testing.T) {
	const base = "auth:\n  token_key: 0123456789abcdef0123456789abcdef\nbroker:\n  gateway: gw:443\n  delivery_groups:\n  - {name: desk, groups: [staff]}\n"
	c, err := Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Broker.Health.CPUPressureMaxPct; got != 80 {
		t.Fatalf("cpu_pressure_max_pct default = %g, want 80", got)
	}
	if c, err = Parse([]byte(base + "  health: {cpu_pressure_max_pct: 45}\n")); err != nil {
		t.Fatalf("cpu_pressure_max_pct 45 refused: %v", err)
	}
	if got := c.Broker.Health.CPUPressureMaxPct; got != 45 {
		t.Fatalf("cpu_pressure_max_pct set to 45 reads %g", got)
	}
	for _, v := range []string{"101", "-1"} {
		_, err := Parse([]byte(base + "  health: {cpu_pressure_max_pct: " + v + "}\n"))
		if err == nil || !strings.Contains(err.Error(), "broker.health.cpu_pressure_max_pct") || !strings.Contains(err.Error(), "not a percentage") {
			t.Errorf("cpu_pressure_max_pct %s: got %v, want an error naming the key", v, err)
		}
	}
}

// TestHealthZeroKept: a threshold written as 0 stays 0 (disk_idle_min_pct:
// 0 is how a shared machine turns the disk idle check off), the keys left
// out keep their defaults, and a misspelt key or a word is refused.
func TestHealthZeroKept(t *testing.T) {
	const base = "auth:\n  token_key: 0123456789abcdef0123456789abcdef\nbroker:\n  gateway: gw:443\n  delivery_groups:\n  - {name: desk, groups: [staff]}\n"
	c, err := Parse([]byte(base + "  health: {disk_idle_min_pct: 0, disk_latency_max_ms: 5000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Health{DiskIdleMinPct: 0, DiskLatencyMaxMS: 5000, MemoryPressureMaxPct: 20, CPUPressureMaxPct: 80}
	if c.Broker.Health != want {
		t.Fatalf("health = %+v, want %+v", c.Broker.Health, want)
	}
	if c, err = Parse([]byte(base + "  health: {}\n")); err != nil || c.Broker.Health != DefaultHealth() {
		t.Fatalf("empty health section: %+v, %v; want the defaults", c.Broker.Health, err)
	}
	for in, msg := range map[string]string{
		"  health: {disk_idle_min: 0}\n":        "broker.health.disk_idle_min (line 7): unknown key; did you mean disk_idle_min_pct?",
		"  health: {disk_idle_min_pct: lots}\n": `broker.health.disk_idle_min_pct (line 7): want a number, got "lots"`,
	} {
		if _, err := Parse([]byte(base + in)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: got %v, want an error with %q", in, err, msg)
		}
	}
}
