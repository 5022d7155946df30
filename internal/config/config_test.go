package config

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestEmptyIsDefaults(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Admin.Listen != "127.0.0.1:9443" || c.Gateway != nil {
		t.Fatalf("defaults wrong: %+v", c)
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
		"gateway:\n  idle_timeout: soon\n":                 "not a duration",
		"gateway:\n  resource_policies:\n  - name: r\n    groups: [g]\n    hosts: [10.0.0.0/33]\n": "CIDR",
		"gateway:\n  connection_policies:\n  - name: c\n":                                          "match nobody",
		"gateway:\n  auth_methods: [ntlm]\n  radius:\n    server: nowhere\n    secret: s\n":        "gateway.radius.server",
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
