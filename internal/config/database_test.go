package config

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// brokerBase is a valid broker config but for its database line.
const brokerBase = "auth:\n  token_key: 0123456789abcdef0123456789abcdef\nbroker:\n  gateway: gw:443\n  delivery_groups:\n  - {name: desk, groups: [staff]}\n"

// TestBrokerDatabaseReference: broker.database, like any secret, may be
// a file: or env: reference (a Kubernetes Secret holding the whole URL,
// mounted as a file); the URL's password is never printed, and a
// reference that cannot be read is reported at its key and line.
func TestBrokerDatabaseReference(t *testing.T) {
	const dsn = "postgres://deskway:pg-s3cret@db.example:5432/deskway?sslmode=require"
	dir := t.TempDir()
	f := filepath.Join(dir, "dsn")
	if err := os.WriteFile(f, []byte(dsn+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DW_TEST_BROKER_DSN", dsn)
	for _, ref := range []string{"file:" + f, "env:DW_TEST_BROKER_DSN"} {
		c, err := Parse([]byte(brokerBase + "  database: " + ref + "\n"))
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if c.Broker.Database.Value() != dsn {
			t.Fatalf("%s resolved to %q, want %q", ref, c.Broker.Database.Value(), dsn)
		}
		shown := printed(t, c)
		if strings.Contains(shown, "pg-s3cret") || !strings.Contains(shown, "database: "+ref+"\n") {
			t.Fatalf("%s: printed as\n%s", ref, shown)
		}
	}

	for _, inline := range []string{dsn, "postgresql://deskway@db.example/deskway?password=pg-s3cret"} {
		c, err := Parse([]byte(brokerBase + "  database: " + inline + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if c.Broker.Database.Value() != inline {
			t.Fatalf("inline URL resolved to %q", c.Broker.Database.Value())
		}
		shown := printed(t, c)
		if strings.Contains(shown, "pg-s3cret") || !strings.Contains(shown, "db.example") {
			t.Fatalf("inline URL printed as\n%s", shown)
		}
		var buf bytes.Buffer
		slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "database", c.Broker.Database)
		if s := buf.String() + fmt.Sprint(c.Broker.Database); strings.Contains(s, "pg-s3cret") {
			t.Fatalf("the password is in a log line or message: %s", s)
		}
	}

	sqlite := filepath.Join(dir, "broker.db")
	c, err := Parse([]byte(brokerBase + "  database: " + sqlite + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Broker.Database.Value() != sqlite || !strings.Contains(printed(t, c), "database: "+sqlite+"\n") {
		t.Fatalf("a SQLite path is %q, printed as\n%s", c.Broker.Database.Value(), printed(t, c))
	}

	for ref, want := range map[string]string{
		"file:" + filepath.Join(dir, "absent"): "broker.database (line 7): secret file " + filepath.Join(dir, "absent") + " does not exist",
		"env:DW_TEST_NOT_SET_ANYWHERE":         "broker.database (line 7): environment variable DW_TEST_NOT_SET_ANYWHERE is not set",
		"postgres://deskway:pg-s3cret@db:x/d":  "broker.database (line 7): is not a URL",
	} {
		_, err := Parse([]byte(brokerBase + "  database: " + ref + "\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error with %q", ref, err, want)
		} else if strings.Contains(err.Error(), "pg-s3cret") {
			t.Errorf("%s: the error quotes the password: %v", ref, err)
		}
	}
}

// printed is the config as deskway config validate prints it.
func printed(t *testing.T, c *Config) string {
	t.Helper()
	b, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
