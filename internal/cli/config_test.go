package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/tlsconf"
)

// Valid bases for each role, which the mistakes below change one line
// of. DIR, IMG, CERT, KEY and TOKEN are filled in per test.
const (
	gatewayBase = `state_dir: DIR
admin:
  listen: 127.0.0.1:0
gateway:
  listen: 127.0.0.1:0
  auth_methods: [ntlm]
  connection_policies:
  - {name: staff, groups: [staff]}
  resource_policies:
  - name: hosts
    groups: [staff]
    hosts: [10.20.0.0/16, rdsh01.corp.example]
`
	streamBase = `state_dir: DIR
admin:
  listen: 127.0.0.1:0
stream:
  listen: 127.0.0.1:0
  tls: "off"
  clients: open
  vdisks:
  - name: golden
    base: IMG
`
	brokerBase = `state_dir: DIR
admin:
  listen: 127.0.0.1:0
auth:
  token_key: file:TOKEN
broker:
  listen: 127.0.0.1:0
  gateway: gw.example.com:443
  frontend_tokens: [frontend-token-0123456789]
  delivery_groups:
  - {name: desk, groups: [staff]}
`
	netbootBase = streamBase + `  netboot:
    interface: lo
    address: 127.0.0.1
    servers: ["127.0.0.1:10809"]
`
	agentBase = `state_dir: DIR
agent:
  broker: https://127.0.0.1:1
  join_token: join-token
  port: 3389
`
	webBase = brokerBase + `web:
  listen: 127.0.0.1:0
  session_idle: 30m
  ldap:
    url: ldap://127.0.0.1:1
    base_dn: dc=example,dc=com
`
)

// TestConfigMistakes: each mistake a new user makes is refused by
// deskway config validate and by the start of the role it concerns, with
// the same message naming the YAML path and its line.
func TestConfigMistakes(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "golden.img")
	token := filepath.Join(dir, "token.key")
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	otherCert, otherKey := filepath.Join(dir, "other.crt"), filepath.Join(dir, "other.key")
	for _, f := range []struct{ path, body string }{{img, ""}, {token, strings.Repeat("k", 32) + "\n"}} {
		if err := os.WriteFile(f.path, []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := tlsconf.SelfSigned(cert, key, []string{"gw.example.com"}); err != nil {
		t.Fatal(err)
	}
	if err := tlsconf.SelfSigned(otherCert, otherKey, []string{"other.example.com"}); err != nil {
		t.Fatal(err)
	}
	fill := strings.NewReplacer("IMG", img, "TOKEN", token, "OTHERKEY", otherKey, "CERT", cert, "KEY", key)
	tlsLines := "tls:\n  cert: CERT\n  key: KEY\n"

	for _, tc := range []struct {
		name, role, base, from, to, want string
	}{
		// An address that looks like IPv4 but is not one was looked up as a DNS name.
		{"ip-shaped policy host", "gateway", gatewayBase, "rdsh01.corp.example", "10.20.0.300",
			`gateway.resource_policies[0].hosts[1] (line 12): "10.20.0.300" is not an IPv4 address (four numbers from 0 to 255), and a host name cannot end in a number`},
		{"ip-shaped gateway for .rdp files", "broker", brokerBase, "gw.example.com:443", "10.20.0.300:443",
			`broker.gateway (line 8): "10.20.0.300:443": "10.20.0.300" is not an IPv4 address (four numbers from 0 to 255), and a host name cannot end in a number`},
		{"ip-shaped boot server address", "stream", netbootBase, "address: 127.0.0.1", "address: 127.0.0.300",
			`stream.netboot.address (line 13): "127.0.0.300" is not this server's IPv4 address on the boot network`},
		{"ip-shaped broker URL", "agent", agentBase, "https://127.0.0.1:1", "https://10.20.0.300:8444",
			`agent.broker (line 3): "https://10.20.0.300:8444": "10.20.0.300" is not an IPv4 address (four numbers from 0 to 255), and a host name cannot end in a number`},
		{"ip-shaped directory", "run", webBase, "ldap://127.0.0.1:1", "ldap://10.20.0.300",
			`web.ldap.url (line 16): "ldap://10.20.0.300": "10.20.0.300" is not an IPv4 address (four numbers from 0 to 255), and a host name cannot end in a number`},

		// A port past 65535 was accepted.
		{"admin port out of range", "gateway", gatewayBase, "listen: 127.0.0.1:0\ngateway", "listen: 127.0.0.1:99999\ngateway",
			`admin.listen (line 3): "127.0.0.1:99999": port 99999 is out of range (0 to 65535)`},
		{"stream port out of range", "stream", streamBase, "listen: 127.0.0.1:0\n  tls", "listen: 127.0.0.1:99999\n  tls",
			`stream.listen (line 5): "127.0.0.1:99999": port 99999 is out of range (0 to 65535)`},
		{"boot server port out of range", "stream", netbootBase, "127.0.0.1:10809", "127.0.0.1:108090",
			`stream.netboot.servers[0] (line 14): "127.0.0.1:108090": port 108090 is out of range (1 to 65535)`},
		{"broker port out of range", "broker", brokerBase, "listen: 127.0.0.1:0\n  gateway", "listen: 127.0.0.1:65536\n  gateway",
			`broker.listen (line 7): "127.0.0.1:65536": port 65536 is out of range (0 to 65535)`},
		{"agent port out of range", "agent", agentBase, "port: 3389", "port: 338900",
			`agent.port (line 5): 338900 is not 1 to 65535`},
		{"broker URL port out of range", "agent", agentBase, "https://127.0.0.1:1", "https://broker.example.com:84440",
			`agent.broker (line 3): "https://broker.example.com:84440": port 84440 is out of range (1 to 65535)`},
		{"web port out of range", "run", webBase, "listen: 127.0.0.1:0\n  session_idle", "listen: 127.0.0.1:84430\n  session_idle",
			`web.listen (line 13): "127.0.0.1:84430": port 84430 is out of range (0 to 65535)`},

		// TLS files: validate said valid, and the start failed.
		{"tls certificate missing", "gateway", gatewayBase + tlsLines, "cert: CERT", "cert: " + filepath.Join(dir, "nope.crt"),
			`tls.cert (line 14): ` + filepath.Join(dir, "nope.crt") + ` does not exist`},
		{"tls key unreadable", "gateway", gatewayBase + tlsLines, "key: KEY", "key: " + dir,
			`tls.key (line 15): ` + dir + ` is a directory, not a file`},
		{"tls key of another certificate", "gateway", gatewayBase + tlsLines, "key: KEY", "key: OTHERKEY",
			`tls.key (line 15): ` + otherKey + ` is not the key of the certificate in ` + cert + ` (tls.cert)`},
		{"tls certificate that is a key", "gateway", gatewayBase + tlsLines, "cert: CERT", "cert: KEY",
			`tls.cert (line 14): ` + key + ` holds no PEM certificate`},

		{"broker CA missing", "agent", agentBase, "  port: 3389", "  port: 3389\n  broker_ca: /nonexistent/ca.pem",
			`agent.broker_ca (line 6): /nonexistent/ca.pem does not exist`},

		// CIDR prefixes, each with its line.
		{"policy prefix too long", "gateway", gatewayBase, "10.20.0.0/16", "10.20.0.0/33",
			`gateway.resource_policies[0].hosts[0] (line 12): "10.20.0.0/33" is not a CIDR prefix: the length after / must be 0 to 32`},
		{"proxy prefix not an address", "broker", brokerBase, "  delivery_groups:", "  proxy_protocol_from:\n  - 10.0.0.0/8\n  - 10.0.0.256/24\n  delivery_groups:",
			`broker.proxy_protocol_from[1] (line 12): "10.0.0.256/24" is not a CIDR prefix: 10.0.0.256 is not an IP address`},

		// Secret files.
		{"token key file missing", "broker", brokerBase, "file:TOKEN", "file:" + filepath.Join(dir, "missing.key"),
			`auth.token_key (line 5): secret file ` + filepath.Join(dir, "missing.key") + ` does not exist`},
		{"join token file missing", "agent", agentBase, "join_token: join-token", "join_token: file:/nonexistent/join",
			`agent.join_token (line 4): secret file /nonexistent/join does not exist`},

		// Unknown keys, with the nearest known one.
		{"misspelt gateway key", "gateway", gatewayBase, "  auth_methods: [ntlm]", "  auth_methods: [ntlm]\n  idle_timout: 5m",
			`gateway.idle_timout (line 7): unknown key; did you mean idle_timeout?`},
		{"misspelt section", "gateway", gatewayBase, "gateway:", "gatway:",
			`gatway (line 4): unknown key; did you mean gateway?`},
		{"misspelt vdisk key", "stream", streamBase, "base: IMG", "bsae: IMG",
			`stream.vdisks[0].bsae (line 10): unknown key; did you mean base?`},
		{"misspelt netboot key", "stream", netbootBase, "interface: lo", "intreface: lo",
			`stream.netboot.intreface (line 12): unknown key; did you mean interface?`},
		{"misspelt delivery group key", "broker", brokerBase, "groups: [staff]}", "group: [staff]}",
			`broker.delivery_groups[0].group (line 11): unknown key; did you mean groups?`},
		{"camel-case agent key", "agent", agentBase, "join_token:", "joinToken:",
			`agent.joinToken (line 4): unknown key; did you mean join_token?`},
		{"misspelt ldap key", "run", webBase, "base_dn:", "basedn:",
			`web.ldap.basedn (line 17): unknown key; did you mean base_dn?`},

		// Type errors, in the file's terms.
		{"duration without unit", "run", webBase, "session_idle: 30m", "session_idle: 30",
			`web.session_idle (line 14): want a duration like 30s, 5m or 8h, got "30"`},
		{"number that is a word", "stream", streamBase, "  clients: open", "  clients: open\n  cache_ram_mb: lots",
			`stream.cache_ram_mb (line 8): want a whole number, got "lots"`},
		{"list written as a word", "gateway", gatewayBase, "auth_methods: [ntlm]", "auth_methods: ntlm",
			`gateway.auth_methods (line 6): want a list ([a, b], or one "- " item a line), got "ntlm"`},
		{"port written as a name", "agent", agentBase, "port: 3389", "port: rdp",
			`agent.port (line 5): want a whole number, got "rdp"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(tc.base, tc.from) {
				t.Fatalf("the base has no %q", tc.from)
			}
			state := t.TempDir()
			good := filepath.Join(t.TempDir(), "good.yaml")
			bad := filepath.Join(t.TempDir(), "bad.yaml")
			base := strings.ReplaceAll(tc.base, "DIR", state)
			write(t, good, fill.Replace(base))
			write(t, bad, fill.Replace(strings.Replace(base, tc.from, tc.to, 1)))
			// The base is valid: the refusal is the mistake's.
			if code, _, errb := runMain(t, "config", "validate", good); code != 0 {
				t.Fatalf("the valid base is refused: %s", errb)
			}
			want := "deskway: config " + bad + ": " + tc.want + "\n"
			code, out, errb := runMain(t, "config", "validate", bad)
			if code != 1 || errb != want || strings.Contains(out, "is valid") {
				t.Errorf("config validate: exit %d\n got %q\nwant %q", code, errb, want)
			}
			code, _, errb = runMain(t, tc.role, "-c", bad)
			if code != 1 || errb != want {
				t.Errorf("deskway %s: exit %d\n got %q\nwant %q", tc.role, code, errb, want)
			}
		})
	}
}

// runMain runs the command line as the binary does, bounded in time: a
// role that starts despite the mistake runs until the deadline and exits 0.
func runMain(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := Main(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}
