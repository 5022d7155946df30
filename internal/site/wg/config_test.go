package wg

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// Keys written by wg genkey / wg pubkey (wireguard-tools).
const (
	testPub1 = "FP9hP99PiauD7ae5KhI16WViN6HFEcClfLu5HkW7Dgg="
	testPub2 = "nvKb22OFwH3ltkKUdNaTevbIcA4MCmvDbOGlusV5eic="
)

const goodYAML = `
listen_port: 51820
private_key: file:/etc/deskway/wg-tenant-a.key
address: [172.31.0.1/32]
sites:
  - name: paris
    public_key: ` + testPub1 + `
    endpoint: 198.51.100.7:51820
    prefixes: [192.168.1.0/24, "2001:db8:1::/48"]
    persistent_keepalive: 25s
  - name: lyon
    public_key: ` + testPub2 + `
    prefixes: [192.168.2.0/24]
`

func decode(t *testing.T, text string) Config {
	t.Helper()
	var c Config
	dec := yaml.NewDecoder(strings.NewReader(text))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return c
}

func TestConfigDecodeAndDefaults(t *testing.T) {
	c := decode(t, goodYAML)
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	d := c.withDefaults()
	if d.Interface != "wg0" || d.MTU != 1420 {
		t.Errorf("defaults: interface %q mtu %d, want wg0 1420", d.Interface, d.MTU)
	}
	s := c.Sites[0]
	if s.PublicKey.String() != testPub1 || s.Endpoint != netip.MustParseAddrPort("198.51.100.7:51820") ||
		time.Duration(s.PersistentKeepalive) != 25*time.Second || len(s.Prefixes) != 2 {
		t.Errorf("site decoded as %+v", s)
	}
	if c.Sites[1].Endpoint.IsValid() {
		t.Errorf("a site without endpoint got %s", c.Sites[1].Endpoint)
	}
}

func TestConfigDecodeRefusesBadScalars(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"key", "sites: [{public_key: abc}]", "not a WireGuard key"},
		{"prefix", "sites: [{prefixes: [192.168.1.0/33]}]", "192.168.1.0/33"},
		{"endpoint", "sites: [{endpoint: vpn.example.com:51820}]", "vpn.example.com"},
		{"keepalive", "sites: [{persistent_keepalive: often}]", "not a duration"},
		{"unknown key", "listen_prot: 1", "listen_prot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			dec := yaml.NewDecoder(strings.NewReader(tc.text))
			dec.KnownFields(true)
			err := dec.Decode(&c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decode %q: %v, want an error with %q", tc.text, err, tc.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"port zero", func(c *Config) { c.ListenPort = 0 }, "listen_port: 0 is not a UDP port"},
		{"port high", func(c *Config) { c.ListenPort = 70000 }, "listen_port: 70000"},
		{"no key", func(c *Config) { c.PrivateKey = "" }, "private_key: missing"},
		{"inline key", func(c *Config) { c.PrivateKey = "8GzH7fYx3NCmsz5v4y0nDkz+oRVBz2mPZ0v7cJbVwUs=" }, "private_key: write file:PATH or env:NAME"},
		{"bare file:", func(c *Config) { c.PrivateKey = "file:" }, "private_key: write file:PATH"},
		{"interface", func(c *Config) { c.Interface = "a-name-far-too-long" }, "interface:"},
		{"mtu", func(c *Config) { c.MTU = 1000 }, "mtu: 1000"},
		{"no sites", func(c *Config) { c.Sites = nil }, "sites: no sites"},
		{"site name", func(c *Config) { c.Sites[1].Name = "" }, "sites[1].name"},
		{"duplicate name", func(c *Config) { c.Sites[1].Name = "paris" }, `sites[1].name: "paris" is also sites[0]`},
		{"no public key", func(c *Config) { c.Sites[1].PublicKey = PublicKey{} }, "sites[1].public_key: missing"},
		{"shared public key", func(c *Config) { c.Sites[1].PublicKey = c.Sites[0].PublicKey }, "sites[1].public_key: the same key as sites[0]"},
		{"no prefixes", func(c *Config) { c.Sites[1].Prefixes = nil }, "sites[1].prefixes: none"},
		{"host bits", func(c *Config) { c.Sites[1].Prefixes[0] = netip.MustParsePrefix("192.168.2.1/24") }, "sites[1].prefixes[0]: 192.168.2.1/24 has host bits set; the network is 192.168.2.0/24"},
		{"overlap between sites", func(c *Config) { c.Sites[1].Prefixes[0] = netip.MustParsePrefix("192.168.1.128/25") },
			`sites[1].prefixes[0]: 192.168.1.128/25 overlaps 192.168.1.0/24 of site "paris" (sites[0].prefixes[0])`},
		{"same prefix in two sites", func(c *Config) { c.Sites[1].Prefixes[0] = netip.MustParsePrefix("2001:db8:1::/48") }, `of site "paris"`},
		{"overlap within a site", func(c *Config) {
			c.Sites[1].Prefixes = append(c.Sites[1].Prefixes, netip.MustParsePrefix("192.168.0.0/16"))
		}, "sites[1].prefixes[1]: 192.168.0.0/16 overlaps 192.168.2.0/24 (sites[1].prefixes[0])"},
		{"endpoint without address", func(c *Config) { c.Sites[1].Endpoint = netip.MustParseAddrPort("0.0.0.0:51820") }, "sites[1].endpoint"},
		{"keepalive fraction", func(c *Config) { c.Sites[1].PersistentKeepalive = Keepalive(1500 * time.Millisecond) }, "sites[1].persistent_keepalive: 1.5s"},
		{"keepalive long", func(c *Config) { c.Sites[1].PersistentKeepalive = Keepalive(20 * time.Hour) }, "sites[1].persistent_keepalive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := decode(t, goodYAML)
			tc.change(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v\nwant an error with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "8GzH7fYx") {
				t.Errorf("the error echoes an inline key: %v", err)
			}
		})
	}
}

func TestPrivateKeyNeverPrints(t *testing.T) {
	k, err := ParsePrivateKey("8GzH7fYx3NCmsz5v4y0nDkz+oRVBz2mPZ0v7cJbVwUs=\n")
	if err != nil {
		t.Fatal(err)
	}
	if k.String() != "REDACTED" || k.LogValue().String() != "REDACTED" {
		t.Errorf("a private key prints as %q / %q", k.String(), k.LogValue())
	}
	if _, err := ParsePrivateKey("8GzH7fYx3NCmsz5v4y0nDkz+oRVBz2mPZ0v7cJbVwU"); err == nil || strings.Contains(err.Error(), "8GzH") {
		t.Errorf("a truncated key: %v", err)
	}
	// The public half as `wg pubkey` derives it from the same key.
	pub, err := k.Public()
	if err != nil || pub.String() != "AXsRVd/VlgrRLsVFh0x+6V0yf1WU2BngCeu30rRnLWE=" {
		t.Errorf("public key %s, %v", pub, err)
	}
}
