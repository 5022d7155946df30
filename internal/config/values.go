package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

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
			return fmt.Errorf("secret file %s", fileProblem(path, err))
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

// resolveSecrets reads every env: and file: secret, before defaults copy
// any of them (web.frontend_token from broker.frontend_tokens), so each
// failure is reported once, at the key that was written.
func (c *Config) resolveSecrets() error {
	var errs []error
	resolve := func(key string, s *Secret) {
		if err := s.Resolve(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.src.where(key), err))
		}
	}
	for i := range c.Admin.Tokens {
		resolve(fmt.Sprintf("admin.tokens[%d]", i), &c.Admin.Tokens[i])
	}
	for i := range c.Admin.ConsoleTokens {
		resolve(fmt.Sprintf("admin.console_tokens[%d]", i), &c.Admin.ConsoleTokens[i])
	}
	resolve("auth.token_key", &c.Auth.TokenKey)
	for i := range c.Auth.Users {
		resolve(fmt.Sprintf("auth.users[%d].password", i), &c.Auth.Users[i].Password)
		resolve(fmt.Sprintf("auth.users[%d].nt_hash", i), &c.Auth.Users[i].NTHash)
	}
	for i := range c.Auth.DesktopAccounts {
		resolve(fmt.Sprintf("auth.desktop_accounts[%d].password", i), &c.Auth.DesktopAccounts[i].Password)
	}
	if c.Agent != nil {
		resolve("agent.join_token", &c.Agent.JoinToken)
	}
	if c.Broker != nil {
		resolve("broker.database", &c.Broker.Database.s)
		for i := range c.Broker.FrontendTokens {
			resolve(fmt.Sprintf("broker.frontend_tokens[%d]", i), &c.Broker.FrontendTokens[i])
		}
	}
	if w := c.Web; w != nil {
		resolve("web.frontend_token", &w.FrontendToken)
		resolve("web.cookie_key", &w.CookieKey)
		if w.OIDC != nil {
			resolve("web.oidc.client_secret", &w.OIDC.ClientSecret)
		}
		if w.Console != nil {
			resolve("web.console.token", &w.Console.Token)
		}
		if w.LDAP != nil {
			resolve("web.ldap.bind_password", &w.LDAP.BindPassword)
		}
	}
	if c.Gateway != nil && c.Gateway.RADIUS != nil {
		resolve("gateway.radius.secret", &c.Gateway.RADIUS.Secret)
	}
	if c.Farm != nil {
		resolve("farm.database", &c.Farm.Database)
	}
	if c.Site != nil {
		resolveSiteSecrets(c.Site, resolve)
	}
	return errors.Join(errs...)
}
