// Package config loads deskway's single YAML file: a check of its shape
// (every key known, with the nearest known key suggested for one that is
// not, and every value of the kind its key wants), secrets, defaults, and
// validation. Every mistake names its YAML path and line. A present
// section enables its role.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
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
	// Site is the site gateway: tenants' GRE tunnels (deskway site).
	Site *Site `yaml:"site"`
	// Farm is what the gateway nodes of a farm share.
	Farm *Farm `yaml:"farm"`
	// ClockOffset moves the wall clock the token signer and checker read
	// by this much. It is never read from a file: only the hidden
	// --clock-offset flag of deskway gateway and deskway broker sets it,
	// so the fault bench can run a role whose clock is off, which a Go
	// binary (reading the time through the vDSO) cannot be given from
	// outside.
	ClockOffset time.Duration `yaml:"-"`
	// ClockFile, when set, holds the offset in place of ClockOffset (a
	// Go duration such as 10m or -10m), read each time the clock is:
	// writing it steps the role's clock mid-run. Like ClockOffset it is
	// never read from a file of settings: only the hidden
	// --clock-offset-file flag sets it, for the fault bench's clock
	// jump. An absent or unreadable file leaves ClockOffset in force.
	ClockFile string `yaml:"-"`
	// src is the file the config was read from, for the lines of mistakes.
	src *source
}

// Now is the wall clock the roles' tokens are signed and checked by:
// this machine's, moved by ClockOffset or by what ClockFile holds now.
func (c *Config) Now() time.Time {
	off := c.ClockOffset
	if c.ClockFile != "" {
		if b, err := os.ReadFile(c.ClockFile); err == nil {
			if d, err := time.ParseDuration(strings.TrimSpace(string(b))); err == nil {
				off = d
			}
		}
	}
	return time.Now().Add(off)
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
	// DesktopAccounts map portal (gateway) users to the session hosts'
	// accounts they log on as: the broker counts a host's report of the
	// account as the user's session, and the gateway logs a browser
	// session of the user on with the account's password.
	DesktopAccounts []DesktopAccount `yaml:"desktop_accounts"`
}

// DesktopAccount is one user's account on the session hosts.
type DesktopAccount struct {
	// User is the portal user (the name the gateway's token carries).
	User string `yaml:"user"`
	// Account is the host's user name, as its RDP server and the agent's
	// session reports name it.
	Account string `yaml:"account"`
	// Domain is the host account's domain, when it has one.
	Domain string `yaml:"domain"`
	// Password is the host account's password.
	Password Secret `yaml:"password"`
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

// Parse decodes YAML strictly, resolves secrets, applies defaults and
// validates. Every mistake is reported by its YAML path and line.
func Parse(b []byte) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if err := checkShape(&doc); err != nil {
		return nil, err
	}
	c := &Config{src: &source{root: &doc}}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if err := c.resolveSecrets(); err != nil {
		return nil, err
	}
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
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
		c.streamDefaults(st)
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
		gatewayDefaults(g)
	}
	if s := c.Site; s != nil {
		siteDefaults(s)
	}
}

// Validate checks the decoded, defaulted config and names the key at fault.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", c.src.where(key), fmt.Sprintf(format, a...)))
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
	checkListen(bad, "admin.listen", c.Admin.Listen)
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		bad("tls", "give both cert and key, or neither for a self-signed certificate")
	} else if c.TLS.Cert != "" {
		checkKeyPair(bad, "tls.cert", "tls.key", c.TLS.Cert, c.TLS.Key)
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
	validateDesktopAccounts(c.Auth.DesktopAccounts, bad)
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
		c.validateAgent(a, bad)
	}
	c.validateAdminConsoleTokens(bad)
	if w := c.Web; w != nil {
		c.validateWeb(w, bad)
	}
	if s := c.Site; s != nil {
		validateSite(s, bad)
	}
	return errors.Join(errs...)
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
