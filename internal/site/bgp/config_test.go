package bgp

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.yaml.in/yaml/v3"
)

const goodYAML = `
asn: 65000
router_id: 192.0.2.1
listen: [192.0.2.1, "2001:db8:ff::1"]
peers:
  - address: 192.0.2.2
    asn: 65001
    password: md5-key
    hold_time: 9s
    max_prefixes: 50
announce: [10.0.0.0/24]
accept: [192.168.0.0/16]
`

func decode(t *testing.T, text string) (Config, error) {
	t.Helper()
	var c Config
	dec := yaml.NewDecoder(strings.NewReader(text))
	dec.KnownFields(true)
	err := dec.Decode(&c)
	return c, err
}

func TestConfigYAML(t *testing.T) {
	c, err := decode(t, goodYAML)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate("site.tenants[0].bgp"); err != nil {
		t.Fatalf("a good section was refused: %v", err)
	}
	p := c.Peers[0]
	if p.HoldTime != 9*time.Second || p.MaxPrefixes != 50 || p.Password != "md5-key" || c.port() != 179 {
		t.Fatalf("decoded %+v", c)
	}
	if _, err := decode(t, goodYAML+"max_prefix: 3\n"); err == nil {
		t.Error("an unknown key was accepted")
	}
	if _, err := decode(t, strings.Replace(goodYAML, "asn: 65001", "asn: -1", 1)); err == nil {
		t.Error("a negative AS number was accepted")
	}
	if _, err := decode(t, strings.Replace(goodYAML, "hold_time: 9s", "hold_time: soon", 1)); err == nil {
		t.Error("a hold time that is no duration was accepted")
	}
}

func TestConfigValidateNamesKeys(t *testing.T) {
	base := func() Config {
		c, err := decode(t, goodYAML)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		key  string
		edit func(*Config)
	}{
		{"t.asn", func(c *Config) { c.ASN = 0 }},
		{"t.router_id", func(c *Config) { c.RouterID = "2001:db8::1" }},
		{"t.listen", func(c *Config) { c.Listen = nil }},
		{"t.listen[1]", func(c *Config) { c.Listen[1] = "gateway" }},
		{"t.peers", func(c *Config) { c.Peers = nil }},
		{"t.peers[0].address", func(c *Config) { c.Peers[0].Address = "192.0.2.300" }},
		{"t.peers[0].address", func(c *Config) { c.Peers[0].Address = "fe80::1%vt" }},
		{"t.peers[1].address", func(c *Config) { c.Peers = append(c.Peers, c.Peers[0]) }},
		{"t.peers[0].asn", func(c *Config) { c.Peers[0].ASN = 0 }},
		{"t.peers[0].hold_time", func(c *Config) { c.Peers[0].HoldTime = 2 * time.Second }},
		{"t.peers[0].hold_time", func(c *Config) { c.Peers[0].HoldTime = 3500 * time.Millisecond }},
		{"t.peers[0].password", func(c *Config) { c.Peers[0].Password = "env:BGP_KEY" }},
		{"t.peers[0].password", func(c *Config) { c.Peers[0].Password = Secret(strings.Repeat("k", 81)) }},
		{"t.announce[0]", func(c *Config) { c.Announce[0] = "10.0.0.1/24" }},
		{"t.accept[0]", func(c *Config) { c.Accept[0] = "192.168.0.0" }},
	} {
		c := base()
		tc.edit(&c)
		err := c.Validate("t")
		if err == nil || !strings.Contains(err.Error(), tc.key+":") {
			t.Errorf("%s: got %v, want an error naming the key", tc.key, err)
		}
	}
}

func TestSecretNeverPrints(t *testing.T) {
	s := Secret("md5-key")
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("peer", "password", s)
	for _, out := range []string{buf.String(), fmt.Sprint(s), fmt.Sprintf("%v %s", s, s)} {
		if strings.Contains(out, "md5-key") {
			t.Errorf("the key printed: %s", out)
		}
	}
	if v, _ := s.MarshalYAML(); v != "REDACTED" {
		t.Errorf("marshalled as %v", v)
	}
	if v, _ := Secret("file:/etc/deskway/bgp.key").MarshalYAML(); v != "file:/etc/deskway/bgp.key" {
		t.Errorf("a reference marshalled as %v", v)
	}
}

// TestStartOutsideANamespace: a namespace that does not exist fails Start
// with an error naming it, leaves no metrics behind and Stop a no-op.
func TestStartOutsideANamespace(t *testing.T) {
	c, err := decode(t, goodYAML)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sp, err := New(c, Options{Tenant: "acme", Netns: "/run/netns/dwbgp-none", Sink: newSink(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	err = sp.Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), "/run/netns/dwbgp-none") {
		t.Fatalf("Start in a missing namespace: %v", err)
	}
	if n := testutil.CollectAndCount(reg); n != 0 {
		t.Errorf("%d metrics left registered by a failed Start", n)
	}
	sp.Stop()
}
