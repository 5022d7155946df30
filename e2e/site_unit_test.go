package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/testkit"
)

// TestSiteUnitCapabilities runs deskway site as deploy's
// deskway-site.service would, as far as capabilities go: a user that is
// not root (nobody here: the package's deskway user is made by its
// install), with the unit's bounding and ambient capabilities and no new
// privileges. The gateway makes a tenant's namespace it does not find,
// its TUN device, a GRE raw socket and a WireGuard interface, forwards,
// and removes the namespace on SIGTERM.
func TestSiteUnitCapabilities(t *testing.T) {
	parallel(t)
	testkit.Require(t, "setpriv", "wg")
	u := readUnit(t, "../deploy/systemd/deskway-site.service")
	if u.user != "deskway" || len(u.ambient) == 0 || strings.Join(u.ambient, ",") != strings.Join(u.bounding, ",") {
		t.Fatalf("deskway-site.service: user %s, ambient %v, bounding %v", u.user, u.ambient, u.bounding)
	}
	r := newSmallSiteRig(t)
	dir := t.TempDir()
	gwKey, _ := testkit.WireGuardKey(t, dir, "gateway")
	_, officePub := testkit.WireGuardKey(t, dir, "office")
	ns := "dwxn-" + r.sfx
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	cfg := filepath.Join(dir, "gateway.yaml")
	writeFile(t, cfg, fmt.Sprintf(`state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["e2e-admin-token"]}
site:
  underlay:
    addresses: [198.51.100.1]
  tenants:
  - name: a
    key: 1001
    namespace: %[2]s
    prefixes: [10.0.0.0/24]
    sites:
    - name: office
      peer: 198.51.100.2
      prefixes: [192.168.1.0/24]
    wireguard:
      listen_port: 51820
      private_key: file:%[3]s
      sites:
      - name: roaming
        public_key: %[4]s
        prefixes: [192.168.2.0/24]
`, filepath.Join(dir, "state"), ns, gwKey, officePub))
	// The files are readable by nobody, and the state directory its own
	// (as the package makes them for deskway), so that only what the
	// gateway does in the network needs the capabilities.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{cfg, gwKey} {
		if err := os.Chmod(f, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("install", "-d", "-o", "nobody", "-g", "nogroup", "-m", "0750", filepath.Join(dir, "state")).CombinedOutput(); err != nil {
		t.Fatalf("state directory: %v %s", err, out)
	}
	c := "+" + strings.Join(u.ambient, ",+")
	p := testkit.Start(t, nil, "nsenter", "--net=/run/netns/"+r.gw, "setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
		"--bounding-set", "-all,"+c, "--inh-caps", c, "--ambient-caps", c, "--no-new-privs", "--", r.bin, "site", "-c", cfg)
	waitLog(t, p, `"msg":"site gateway forwarding"`)
	if !strings.Contains(p.Log.String(), `"msg":"created the tenant's namespace"`) {
		t.Fatalf("the gateway did not create the tenant's namespace:\n%s", tail(p.Log.String(), 3000))
	}
	for _, dev := range []string{"dw-a", "wg0"} {
		if out, err := r.exec(ns, "ip", "link", "show", dev); err != nil {
			t.Fatalf("%s in the tenant's namespace: %v\n%s", dev, err, out)
		}
	}
	r.stop(p)
	if out, _ := exec.Command("ip", "netns", "list").CombinedOutput(); strings.Contains(string(out), ns) {
		t.Fatalf("the gateway stopped and the namespace it made is still there:\n%s", out)
	}
}
