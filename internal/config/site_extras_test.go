package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// wgKey is a WireGuard private key as wg genkey writes it (a test key).
const wgKey = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="

// siteWithExtras is a tenant with GRE, WireGuard and BGP, and a tenant
// with WireGuard alone; keyFile is the WireGuard key's path.
func siteWithExtras(keyFile string) string {
	return `site:
  underlay:
    addresses: [198.51.100.1]
  tenants:
  - name: a
    key: 1001
    prefixes: [10.0.0.0/24]
    sites:
    - name: office
      peer: 198.51.100.2
      prefixes: [172.16.0.0/30]
    wireguard:
      listen_port: 51820
      private_key: file:` + keyFile + `
      address: [172.31.0.1/32]
      sites:
      - name: paris
        public_key: FP9hP99PiauD7ae5KhI16WViN6HFEcClfLu5HkW7Dgg=
        endpoint: 198.51.100.7:51820
        prefixes: [192.168.1.0/24]
        persistent_keepalive: 25s
    bgp:
      asn: 65000
      router_id: 10.0.0.1
      listen: [10.0.0.1]
      peers:
      - address: 172.16.0.2
        asn: 65001
        password: env:SITE_BGP_KEY
        hold_time: 9s
      accept: [192.168.0.0/16]
  - name: b
    key: 1002
    wireguard:
      listen_port: 51821
      private_key: file:` + keyFile + `
      sites:
      - name: lyon
        public_key: nvKb22OFwH3ltkKUdNaTevbIcA4MCmvDbOGlusV5eic=
        prefixes: [192.168.1.0/24]
`
}

func writeKey(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "wg.key")
	if err := os.WriteFile(p, []byte(wgKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSiteWireGuardAndBGP(t *testing.T) {
	t.Setenv("SITE_BGP_KEY", "md5-secret")
	c, err := Parse([]byte(siteWithExtras(writeKey(t))))
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.Site.Tenants[0], c.Site.Tenants[1]
	if a.WireGuard == nil || a.WireGuard.Key() != wgKey || a.WireGuard.ListenPort != 51820 || len(a.WireGuard.Sites) != 1 ||
		a.WireGuard.Sites[0].Prefixes[0].String() != "192.168.1.0/24" || a.WireGuard.Sites[0].Endpoint.Port() != 51820 {
		t.Fatalf("wireguard read as %+v", a.WireGuard)
	}
	if a.BGP == nil || string(a.BGP.Peers[0].Password) != "md5-secret" || a.BGP.Peers[0].HoldTime.Seconds() != 9 {
		t.Fatalf("bgp read as %+v", a.BGP)
	}
	if len(b.Sites) != 0 || b.WireGuard == nil {
		t.Fatalf("a tenant with WireGuard sites alone: %+v", b)
	}
}

// Each mistake in a wireguard or bgp section is named by its key and
// line, like every other.
func TestSiteExtrasValidation(t *testing.T) {
	t.Setenv("SITE_BGP_KEY", "md5-secret")
	key := writeKey(t)
	good := siteWithExtras(key)
	badKey := filepath.Join(t.TempDir(), "bad.key")
	if err := os.WriteFile(badKey, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ from, to, want string }{
		{"listen_port: 51821", "listen_port: 51820", "site.tenants[1].wireguard.listen_port (line 35): 51820 is tenant a's port too"},
		{"private_key: file:" + key + "\n      address", "private_key: " + wgKey + "\n      address", "site.tenants[0].wireguard.private_key (line 14): write file:PATH or env:NAME"},
		{"private_key: file:" + key + "\n      address", "private_key: file:" + badKey + "\n      address", "site.tenants[0].wireguard.private_key (line 14): what file:" + badKey + " holds is not a WireGuard private key"},
		{"prefixes: [192.168.1.0/24]\n        persistent", "prefixes: [172.16.0.0/24]\n        persistent", "site.tenants[0].wireguard.sites[0].prefixes[0] (line 20): 172.16.0.0/24 overlaps 172.16.0.0/30 of the same tenant"},
		{"endpoint: 198.51.100.7:51820", "endpoint: 198.51.100.7", "site.tenants[0].wireguard.sites[0].endpoint (line 19): want a string"},
		{"      asn: 65000\n", "", "site.tenants[0].bgp.asn (not set; its section is on line 22): the gateway's AS number is missing"},
		{"hold_time: 9s", "hold_time: 2s", "site.tenants[0].bgp.peers[0].hold_time (line 30): 2s is not a whole number"},
		{"password: env:SITE_BGP_KEY", "password: env:SITE_NO_SUCH_KEY", "site.tenants[0].bgp.peers[0].password (line 29): environment variable SITE_NO_SUCH_KEY is not set"},
		{"      sites:\n      - name: lyon", "      interface: dw-b\n      sites:\n      - name: lyon", `site.tenants[1].wireguard.interface (line 37): "dw-b" is the tenant's GRE device too`},
		{"  - name: b\n    key: 1002\n    wireguard:", "  - name: b\n    key: 1002\n    bgp: {asn: 1, router_id: 10.0.0.1, listen: [10.0.0.1], peers: [{address: 10.0.0.2, asn: 2}]}\n    wireguard:",
			"site.tenants[1].bgp (line 34): a second tenant with BGP in one process"},
		{"    wireguard:\n      listen_port: 51821\n      private_key: file:" + key + "\n      sites:\n      - name: lyon\n        public_key: nvKb22OFwH3ltkKUdNaTevbIcA4MCmvDbOGlusV5eic=\n        prefixes: [192.168.1.0/24]\n", "",
			"site.tenants[1].sites (not set; its section is on line 32): give at least one site (peer, prefixes), or a wireguard section"},
		{"listen_port: 51821", "listen_prot: 51821", "site.tenants[1].wireguard.listen_prot (line 35): unknown key; did you mean listen_port?"},
	}
	for _, c := range cases {
		if !strings.Contains(good, c.from) {
			t.Fatalf("the test's file has no %q", c.from)
		}
		in := strings.Replace(good, c.from, c.to, 1)
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q → %q: want an error containing %q, got %v", c.from, c.to, c.want, err)
		}
	}
}

// docBlock is docs/site.md's yaml block marked <!-- e2e: name -->.
func docBlock(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/site.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- e2e: "+name+" -->\n```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatalf("docs/site.md has no yaml block marked <!-- e2e: %s -->", name)
	}
	return block
}

// The WireGuard and BGP examples in docs/site.md are valid files, and
// the mistakes the text quotes are reported as quoted.
func TestSiteDocExtras(t *testing.T) {
	wgDoc := strings.Replace(docBlock(t, "site-wireguard"), "/etc/deskway/wg-tenant-a.key", writeKey(t), 1)
	c, err := Parse([]byte(wgDoc))
	if err != nil {
		t.Fatalf("docs/site.md's WireGuard example: %v", err)
	}
	if w := c.Site.Tenants[0].WireGuard; w == nil || len(w.Sites) != 2 || w.Key() != wgKey {
		t.Fatalf("docs/site.md's WireGuard example read as %+v", c.Site.Tenants[0])
	}
	t.Setenv("ACME_BGP_KEY", "md5-key")
	bgpDoc := docBlock(t, "site-bgp")
	c, err = Parse([]byte(bgpDoc))
	if err != nil {
		t.Fatalf("docs/site.md's BGP example: %v", err)
	}
	if b := c.Site.Tenants[0].BGP; b == nil || string(b.Peers[0].Password) != "md5-key" || len(b.Announce) != 2 {
		t.Fatalf("docs/site.md's BGP example read as %+v", c.Site.Tenants[0].BGP)
	}
	doc, err := os.ReadFile("../../docs/site.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ")
	for _, m := range []struct{ in, from, to string }{
		{wgDoc, "prefixes: [192.168.2.0/24]", "prefixes: [192.168.1.128/25]"},
		{bgpDoc, "hold_time: 9s", "hold_time: 2s"},
	} {
		_, err := Parse([]byte(strings.Replace(m.in, m.from, m.to, 1)))
		if err == nil {
			t.Fatalf("%s passed", m.to)
		}
		if !strings.Contains(text, "`"+err.Error()+"`") {
			t.Errorf("docs/site.md does not quote the error as it is written: %v", err)
		}
	}
}
