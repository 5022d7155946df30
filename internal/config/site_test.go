package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

const goodSite = `site:
  underlay:
    addresses: [198.51.100.1, "2001:db8::1"]
  tenants:
  - name: contoso
    key: 4097
    prefixes: [10.0.0.0/24]
    sites:
    - name: paris
      peer: 198.51.100.2
      prefixes: [192.168.1.0/24]
  - name: fabrikam
    key: 4098
    namespace: fab
    mtu: 1300
    sequence: true
    prefixes: [10.0.0.0/24]
    sites:
    - name: lyon
      peer: "2001:db8::3"
      prefixes: [192.168.1.0/24, "fd00:1::/64"]
`

func TestSiteDefaults(t *testing.T) {
	c, err := Parse([]byte(goodSite))
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.Site.Tenants[0], c.Site.Tenants[1]
	if a.Namespace != "deskway-contoso" || a.Interface != "dw-contoso" || a.MTU != 1400 {
		t.Fatalf("defaults: %+v", a)
	}
	if b.Namespace != "fab" || b.MTU != 1300 || !b.Sequence {
		t.Fatalf("given values: %+v", b)
	}
}

// Each mistake is named by its key and line.
func TestSiteValidationNamesKey(t *testing.T) {
	tenant := func(extra string) string {
		return "site:\n  underlay:\n    addresses: [198.51.100.1]\n  tenants:\n  - name: a\n    key: 1\n    sites:\n    - peer: 198.51.100.2\n      prefixes: [192.168.1.0/24]\n" + extra
	}
	cases := map[string]string{
		"site:\n  tenants: []\n": "site.underlay.addresses (not set; its section is on line 1): give this gateway's tunnel endpoint address",
		"site:\n  underlay:\n    addresses: [198.51.100.1, 198.51.100.9]\n":                                                                                             "site.underlay.addresses[1] (line 3): a second IPv4 address",
		"site:\n  underlay:\n    addresses: [\"0.0.0.0\"]\n":                                                                                                            `site.underlay.addresses[0] (line 3): "0.0.0.0" is not a unicast IP address`,
		"site:\n  underlay:\n    addresses: [198.51.100.1]\n    send: raw\n":                                                                                            `site.underlay.send (line 4): "raw" is neither frames`,
		"site:\n  datapath: ebpf\n  underlay:\n    addresses: [198.51.100.1]\n":                                                                                         `site.datapath (line 2): "ebpf" is none of auto`,
		"site:\n  datapath: kernel\n  underlay:\n    addresses: [\"2001:db8::1\"]\n":                                                                                    "site.datapath (line 2): kernel carries GRE over IPv4",
		tenant("  - name: b\n    key: 1\n    sites:\n    - peer: 198.51.100.3\n      prefixes: [192.168.2.0/24]\n"):                                                     "site.tenants[1].key (line 11): 1 is tenant a's key too",
		tenant("  - name: A\n    key: 2\n    sites:\n    - peer: 198.51.100.3\n      prefixes: [192.168.2.0/24]\n"):                                                     `site.tenants[1].name (line 10): "A" is not 1 to 31 lower-case`,
		tenant("  - name: b\n    sites:\n    - peer: 198.51.100.3\n      prefixes: [192.168.2.0/24]\n"):                                                                 "site.tenants[1].key (not set; its section is on line 10): give the GRE key",
		tenant("  - name: b\n    key: 2\n    namespace: deskway-a\n    sites:\n    - peer: 198.51.100.3\n      prefixes: [1.2.3.0/24]\n"):                               `site.tenants[1].namespace (line 12): "deskway-a" is another tenant's`,
		tenant("  - name: b\n    key: 2\n    mtu: 100\n    sites:\n    - peer: 198.51.100.3\n      prefixes: [1.2.3.0/24]\n"):                                           "site.tenants[1].mtu (line 12): 100 is not between 1280",
		tenant("  - name: b\n    key: 2\n    sites:\n    - peer: \"2001:db8::2\"\n      prefixes: [1.2.3.0/24]\n"):                                                      "site.tenants[1].sites[0].peer (line 13): 2001:db8::2 is IPv6 and site.underlay.addresses has no IPv6 address",
		tenant("  - name: b\n    key: 2\n    sites:\n    - peer: 198.51.100.3\n      prefixes: [1.2.3.4/24]\n"):                                                         `site.tenants[1].sites[0].prefixes[0] (line 14): "1.2.3.4/24" is not a network in CIDR form`,
		tenant("  - name: b\n    key: 2\n    sites:\n    - peer: 198.51.100.3\n      prefixes: [1.2.0.0/16]\n    - peer: 198.51.100.4\n      prefixes: [1.2.3.0/24]\n"): "site.tenants[1].sites[1].prefixes[0] (line 16): 1.2.3.0/24 overlaps 1.2.0.0/16 of the same tenant",
		tenant("  - name: b\n    key: 2\n    sites:\n    - peer: 198.51.100.3\n      prefixes: [1.2.0.0/16]\n    - peer: 198.51.100.3\n      prefixes: [1.3.0.0/16]\n"): "site.tenants[1].sites[1].peer (line 15): 198.51.100.3 is another site's of this tenant",
		tenant("    gre_key: 5\n"): "gre_key",
		tenant("    key: -1\n"):    "site.tenants[0].key",
	}
	for in, want := range cases {
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s\nwant error containing %q, got %v", in, want, err)
		}
	}
}

// The example in docs/site.md is a valid file.
func TestSiteDocExample(t *testing.T) {
	b, err := os.ReadFile("../../docs/site.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- e2e: site-config -->\n```yaml\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/site.md has no yaml block marked <!-- e2e: site-config -->")
	}
	t.Setenv("DESKWAY_ADMIN_TOKEN", "a-token")
	c, err := Parse(m[1])
	if err != nil {
		t.Fatalf("docs/site.md's example: %v", err)
	}
	if len(c.Site.Tenants) != 2 || c.Site.Tenants[1].Namespace != "deskway-b" {
		t.Fatalf("docs/site.md's example read as %+v", c.Site)
	}
}
