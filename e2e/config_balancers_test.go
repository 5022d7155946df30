package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// balancersConfig trusts %[2]s for the gateway's PROXY headers and %[3]s
// for the broker's.
const balancersConfig = `state_dir: %[1]s
admin: {listen: "127.0.0.1:19443", tokens: [admin-tok]}
auth:
  token_key: validate-test-key-0123456789abcdef0123456789
gateway:
  listen: "127.0.0.1:18443"
  proxy_protocol_from: [%[2]s]
broker:
  listen: "127.0.0.1:18444"
  gateway: "gw.example.test:443"
  proxy_protocol_from: [%[3]s]
  delivery_groups:
  - {name: desk, groups: [staff]}
`

// TestConfigRefusesTrustingEveryAddressForProxyHeaders: whoever may send
// a PROXY header names the client, so proxy_protocol_from of every
// address (0.0.0.0/0, ::/0) would let any client pick the address its
// failed logins and caps count against, and, with farm_peers, reach a
// node without one. deskway config validate refuses it and names the
// key; the balancer's address and network pass.
func TestConfigRefusesTrustingEveryAddressForProxyHeaders(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	validate := func(gw, br string) (string, error) {
		t.Helper()
		cfg := filepath.Join(dir, "deskway.yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(balancersConfig, filepath.Join(dir, "state"), gw, br)), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "config", "validate", cfg).CombinedOutput()
		return string(out), err
	}
	if out, err := validate(`"10.0.0.5"`, `"10.0.0.0/24"`); err != nil {
		t.Fatalf("a balancer's address and network were refused: %v\n%s", err, out)
	}
	out, err := validate(`"10.0.0.5", "0.0.0.0/0"`, `"::/0"`)
	if err == nil {
		t.Fatalf("proxy_protocol_from of every address passed:\n%s", out)
	}
	for _, want := range []string{`gateway.proxy_protocol_from[1] (line 7): "0.0.0.0/0" is every address`, `broker.proxy_protocol_from[0] (line 11): "::/0" is every address`} {
		if !strings.Contains(out, want) {
			t.Errorf("deskway config validate did not say %q:\n%s", want, out)
		}
	}
}
