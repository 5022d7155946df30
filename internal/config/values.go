package config

import (
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

func (c *Config) resolveSecrets() error {
	for i := range c.Admin.Tokens {
		if err := c.Admin.Tokens[i].Resolve(); err != nil {
			return fmt.Errorf("admin.tokens[%d]: %w", i, err)
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
