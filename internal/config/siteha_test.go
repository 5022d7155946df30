package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The pair's example in docs/site.md is a valid file.
func TestSiteHADocExample(t *testing.T) {
	b, err := os.ReadFile("../../docs/site.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- e2e: site-ha-config -->\n```yaml\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/site.md has no yaml block marked <!-- e2e: site-ha-config -->")
	}
	t.Setenv("DESKWAY_SITE_DATABASE", "postgres://site@db/deskway")
	c, err := Parse(m[1])
	if err != nil {
		t.Fatalf("docs/site.md's example: %v", err)
	}
	h := c.Site.HA
	if h == nil || h.Database.Value() != "postgres://site@db/deskway" || h.Lease.D().String() != "1s" || h.Addresses[0].Prefix().String() != "198.51.100.1/24" {
		t.Fatalf("docs/site.md's example read as %+v", h)
	}
	if in := c.Site.Tenants[0].Inside; len(in) != 1 || in[0].Interface != "hosted" {
		t.Fatalf("the tenant's inside addresses read as %+v", in)
	}
}

// Each mistake in a pair's settings is named by its key and line.
func TestSiteHAValidation(t *testing.T) {
	t.Setenv("DESKWAY_SITE_DATABASE", "postgres://site@db/deskway")
	t.Setenv("DESKWAY_NOT_PG", "/var/lib/deskway.db")
	file := func(ha, inside string) string {
		return "site:\n  underlay:\n    addresses: [198.51.100.1]\n" + ha +
			"  tenants:\n  - name: a\n    key: 1\n    sites:\n    - peer: 198.51.100.2\n      prefixes: [192.168.1.0/24]\n" + inside
	}
	good := "  ha:\n    database: env:DESKWAY_SITE_DATABASE\n    group: pair\n    node: gw-1\n    addresses:\n    - {address: 198.51.100.1/24, interface: ul0}\n"
	if _, err := Parse([]byte(file(good, "    inside:\n    - {address: 10.0.0.1/24, interface: hosted}\n"))); err != nil {
		t.Fatalf("a good pair's file: %v", err)
	}
	cases := map[string]string{
		file("", "    inside:\n    - {address: 10.0.0.1/24, interface: hosted}\n"):              "site.tenants[0].inside (line 10): inside addresses move between the gateways of a pair",
		file(strings.Replace(good, "env:DESKWAY_SITE_DATABASE", "postgres://u:pw@db/x", 1), ""): "site.ha.database (line 5): write the database URL as env:NAME or file:PATH",
		file(strings.Replace(good, "env:DESKWAY_SITE_DATABASE", "env:DESKWAY_NOT_PG", 1), ""):   "site.ha.database (line 5): env:DESKWAY_NOT_PG holds no postgres:// URL",
		file(strings.Replace(good, "group: pair", "group: Pair", 1), ""):                        `site.ha.group (line 6): "Pair" is not 1 to 31`,
		file(strings.Replace(good, "node: gw-1", "node: \"\"", 1), ""):                          `site.ha.node (line 7): "" is not 1 to 31`,
		file(good+"    lease: 100ms\n", ""):                                                     "site.ha.lease (line 10): 100ms is not between 300ms and 30s",
		file(strings.Replace(good, "198.51.100.1/24", "198.51.100.9/24", 1), ""):                "site.ha.addresses[0].address (line 9): 198.51.100.9 is not one of site.underlay.addresses",
		file(strings.Replace(good, "198.51.100.1/24", "198.51.100.9/24", 1), "") + " ":          "site.underlay.addresses[0] (line 3): 198.51.100.1 is not in site.ha.addresses",
		file(strings.Replace(good, "198.51.100.1/24", "198.51.100.1", 1), ""):                   `site.ha.addresses[0].address (line 9): "198.51.100.1" is not an address with its prefix length`,
		file(strings.Replace(good, "interface: ul0", "interface: a-name-far-too-long", 1), ""):  "site.ha.addresses[0].interface (line 9)",
		file(good, "    inside:\n    - {address: \"fd00::1/64\", interface: hosted}\n"):         "site.tenants[0].inside[0].address (line 17): fd00::1/64 is IPv6",
	}
	for in, want := range cases {
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s\nwant error containing %q, got %v", in, want, err)
		}
	}
}
