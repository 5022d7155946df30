package config

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/tlsconf"
)

// TestShippedExampleValidates: the annotated example in deploy/ and the
// netboot and farm examples of the docs stay valid under the checks,
// with the files and variables they name made real.
func TestShippedExampleValidates(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := tlsconf.SelfSigned(cert, key, []string{"rdg.example.com"}); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, name := range []string{"token.key", "admin.token", "admin.password", "portal.token", "win10.img", "golden.img", "golden-vmlinuz", "golden-initrd.img", "farm-db-url"} {
		files[name] = filepath.Join(dir, name)
		body := strings.Repeat("k", 32)
		if name == "farm-db-url" {
			body = "postgres://gw:pw@db/farm"
		}
		if err := os.WriteFile(files[name], []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []string{"DESKWAY_ADMIN_TOKEN", "ALICE_PASSWORD", "DESKWAY_PORTAL_TOKEN"} {
		t.Setenv(v, "value-of-"+v)
	}
	b, err := os.ReadFile("../../deploy/deskway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	example := strings.NewReplacer("/etc/deskway/tls.crt", cert, "/etc/deskway/tls.key", key,
		"/etc/deskway/token.key", files["token.key"], "/etc/deskway/admin.token", files["admin.token"],
		"/etc/deskway/admin.password", files["admin.password"], "/etc/deskway/portal.token", files["portal.token"],
		"/srv/vdisks/win10-2026-11.img", files["win10.img"],
		"/var/lib/deskway", dir).Replace(string(b))
	if _, err := Parse([]byte(example)); err != nil {
		t.Fatalf("deploy/deskway.yaml is refused:\n%v", err)
	}
	netboot := strings.NewReplacer("/srv/vdisks/golden.img", files["golden.img"], "/srv/vdisks/golden-vmlinuz", files["golden-vmlinuz"],
		"/srv/vdisks/golden-initrd.img", files["golden-initrd.img"]).Replace(docExample(t, "../../docs/netboot.md", "stream:"))
	if _, err := Parse([]byte(netboot)); err != nil {
		t.Fatalf("the example of docs/netboot.md is refused:\n%v", err)
	}
	farm := "auth:\n  token_key: " + strings.Repeat("k", 32) + "\n" + strings.ReplaceAll(docExample(t, "../../docs/operations.md", "gateway:"), "/etc/deskway/farm-db-url", files["farm-db-url"])
	if _, err := Parse([]byte(farm)); err != nil {
		t.Fatalf("the farm example of docs/operations.md is refused:\n%v", err)
	}
}

// docExample returns the first yaml block of a doc that starts with first.
func docExample(t *testing.T, doc, first string) string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range strings.Split(string(b), "```yaml\n")[1:] {
		if body, _, _ := strings.Cut(block, "```"); strings.HasPrefix(body, first) {
			return body
		}
	}
	t.Fatalf("%s has no yaml example starting with %q", doc, first)
	return ""
}

// TestShapeKeepsWhatTheDecoderTakes: the shape check accepts every form
// the YAML decoder reads (hex and underscored numbers, yes for true,
// empty values, anchors and merge keys), so no valid file changes meaning.
func TestShapeKeepsWhatTheDecoderTakes(t *testing.T) {
	in := `auth:
  token_key: ` + strings.Repeat("k", 32) + `
  max_failures: 0x10
  max_failures_per_address: 1_000
gateway:
  listen: ":8443"
  consent_message:
  connection_policies:
  - &staff {name: staff, groups: [staff]}
  resource_policies:
  - <<: *staff
    name: hosts
    hosts: [10.0.0.0/8, rdsh01, "::1", host.example.]
    ports: [3389]
  farm_peers: ["peer.example.com:https"]
  radius: {server: "[::1]:1812", secret: s, allow_unsigned_responses: yes}
`
	c, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if c.Auth.MaxFailures != 16 || c.Auth.MaxFailuresPerAddress != 1000 || !c.Gateway.RADIUS.AllowUnsignedResponses ||
		c.Gateway.RAP[0].Groups[0] != "staff" || c.Gateway.RAP[0].Name != "hosts" {
		t.Fatalf("decoded %+v %+v", c.Auth, c.Gateway.RAP)
	}
}

// TestMistakeLines: a key left out is placed at its section's line, and
// a file's mistakes are all reported, in order.
func TestMistakeLines(t *testing.T) {
	_, err := Parse([]byte("log:\n  level: info\ngateway:\n  listen: \":1\"\n  resource_policies:\n  - name: r\n    users: [a]\n    hosts: [10.0.0.300, \"fe80::zz\"]\n    ports: [0]\n"))
	want := "gateway.auth_methods (not set; its section is on line 3): paa needs auth.token_key\n" +
		`gateway.resource_policies[0].hosts[0] (line 8): "10.0.0.300" is not an IPv4 address (four numbers from 0 to 255), and a host name cannot end in a number` + "\n" +
		`gateway.resource_policies[0].hosts[1] (line 8): "fe80::zz" is not an IPv6 address` + "\n" +
		"gateway.resource_policies[0].ports[0] (line 9): port 0 is out of range (1 to 65535)"
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
	_, err = Parse([]byte("gateway:\n  listen: \":1\"\n  listen: \":2\"\n  keepalive: [30s]\n  radius: {server: \"rad:1812\", secret: {a: b}}\n"))
	want = "gateway.listen (line 3): written twice (first on line 2)\n" +
		"gateway.keepalive (line 4): want a duration like 30s, 5m or 8h, got a list\n" +
		"gateway.radius.secret (line 5): want a secret written inline, as env:NAME or as file:PATH, got a section of keys"
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
}

// TestNearestKey: a misspelling is matched to the key meant, a key of
// another section is sent there, and a word far from every key gets the
// section's keys instead of a guess.
func TestNearestKey(t *testing.T) {
	keys := []string{"listen", "idle_timeout", "session_timeout", "keepalive", "auth_methods", "max_tunnels"}
	for in, want := range map[string]string{
		"idle_timout": "idle_timeout", "IdleTimeout": "idle_timeout", "keepalvie": "keepalive",
		"lisen": "listen", "max-tunnels": "max_tunnels", "auth_method": "auth_methods", "colour": "", "timeout": "",
	} {
		if got := nearest(in, keys); got != want {
			t.Errorf("nearest(%q) = %q, want %q", in, got, want)
		}
	}
	// A key of another section is sent there.
	for in, want := range map[string]string{
		"gateway:\n  token_key: k\n": "gateway.token_key (line 2): unknown key here; token_key belongs in auth",
		"gateway:\n  hosts: [a]\n":   "gateway.hosts (line 2): unknown key here; hosts belongs in an entry of gateway.resource_policies",
		"stream:\n  dhcp: full\n":    "stream.dhcp (line 2): unknown key here; dhcp belongs in stream.netboot",
	} {
		if _, err := Parse([]byte(in)); err == nil || err.Error() != want {
			t.Errorf("%q: got %v, want %s", in, err, want)
		}
	}
	_, err := Parse([]byte("gateway:\n  colour: blue\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "gateway.colour (line 2): unknown key; the keys here are listen, public_name, auth_methods,") {
		t.Fatalf("got %v", err)
	}
}

// TestFileProblem: why a file cannot be read, in plain words (a test run
// as root reads any file, so permission is shown with the error itself).
func TestFileProblem(t *testing.T) {
	dir := t.TempDir()
	_, missing := os.ReadFile(filepath.Join(dir, "nope"))
	_, isDir := os.ReadFile(dir)
	for err, want := range map[error]string{
		missing: dir + "/x does not exist",
		isDir:   dir + "/x is a directory, not a file",
		&fs.PathError{Op: "open", Path: "/x", Err: fs.ErrPermission}: dir + "/x cannot be read (permission denied)",
	} {
		if got := fileProblem(dir+"/x", err); got != want {
			t.Errorf("%v: got %q, want %q", err, got, want)
		}
	}
}
