package config

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"

	"go.yaml.in/yaml/v3"
)

// DatabaseURL is broker.database: a SQLite file path or a postgres:// URL,
// written inline or, like any secret, as env:NAME or file:PATH, so that a
// URL with its password can come from a Kubernetes Secret or a file only
// the service reads. Printed, a reference stays as written and an inline
// URL has its password masked; a SQLite path is no secret and shows as is.
type DatabaseURL struct {
	s Secret
}

// NewDatabaseURL returns a resolved DatabaseURL holding v.
func NewDatabaseURL(v string) DatabaseURL { return DatabaseURL{s: NewSecret(v)} }

// UnmarshalYAML implements yaml.Unmarshaler; resolution happens in Resolve.
func (d *DatabaseURL) UnmarshalYAML(n *yaml.Node) error { return d.s.UnmarshalYAML(n) }

// MarshalYAML keeps references as written and masks a URL's password.
func (d DatabaseURL) MarshalYAML() (any, error) {
	if isReference(d.s.ref) {
		return d.s.ref, nil
	}
	return displayDSN(d.s.ref), nil
}

// Resolve reads an env: or file: reference.
func (d *DatabaseURL) Resolve() error { return d.s.Resolve() }

// Value returns the resolved path or URL, password included.
func (d DatabaseURL) Value() string { return d.s.Value() }

// IsSet reports whether anything was configured.
func (d DatabaseURL) IsSet() bool { return d.s.IsSet() }

// String is what logs and messages may show: a reference as written,
// else the value with any password masked.
func (d DatabaseURL) String() string {
	if isReference(d.s.ref) {
		return d.s.ref
	}
	return displayDSN(d.s.value)
}

// LogValue implements slog.LogValuer.
func (d DatabaseURL) LogValue() slog.Value { return slog.StringValue(d.String()) }

// isPostgres reports whether dsn names a PostgreSQL database rather than
// a SQLite file.
func isPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

func isReference(ref string) bool {
	return strings.HasPrefix(ref, "env:") || strings.HasPrefix(ref, "file:")
}

// displayDSN is dsn with its password masked: a SQLite path as it is, a
// PostgreSQL URL with xxxxx for the password (and for its password
// parameter), and REDACTED for one too broken to tell its parts.
func displayDSN(dsn string) string {
	if !isPostgres(dsn) {
		return dsn
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "REDACTED"
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// checkDatabase checks what a database reference resolved to. The
// message never quotes the URL: it may hold a password.
func checkDatabase(bad badFunc, key string, d DatabaseURL) {
	v := d.Value()
	switch {
	case d.IsSet() && v == "":
		bad(key, "%s gives an empty database: write a SQLite file path or a postgres:// URL", d.s.ref)
	case isPostgres(v):
		if _, err := url.Parse(v); err != nil {
			bad(key, "is not a URL a PostgreSQL client can use: %v", urlProblem(err))
		}
	}
}

// urlProblem is what is wrong with a URL, without the URL itself.
func urlProblem(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
