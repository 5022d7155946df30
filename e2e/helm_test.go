package e2e

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestHelmChart: deploy/helm/deskway passes helm lint --strict and helm
// template (Helm's own packages, in tools/chartcheck) with its defaults
// as they are, a farm and the committed production example; every object
// it renders decodes strictly with the Kubernetes API types, its pods
// meet Pod Security "restricted" and the chart's production rules, an
// upgrade keeps what the install generated, values it cannot work with
// are refused with their reason, and the documented helm lines render.
// Then each role's deskway configuration, with the secret files its pod
// would mount (from the rendered Secrets, or the case's stand-ins for
// existing ones), is one deskway itself accepts, and the brokers the
// farm and production put on PostgreSQL read it as PostgreSQL. Those
// two brokers are a StatefulSet, each pod with a file of its own: each
// names the other in broker.peers, and takes the other's certificate,
// the one every broker pod serves, under broker.peer_ca and
// broker.peer_server_name.
func TestHelmChart(t *testing.T) {
	parallel(t) // renders and decodes in a folder of its own
	out := t.TempDir()
	check := exec.Command("go", "run", ".", "-repo", "../..", "-out", out)
	check.Dir = "../tools/chartcheck"
	if b, err := check.CombinedOutput(); err != nil {
		t.Fatalf("chartcheck: %v\n%s", err, b)
	} else {
		t.Logf("%s", b)
	}
	bin := build(t)
	for c, want := range map[string][]string{
		"defaults":   {"broker", "gateway", "web"},
		"farm":       {"broker-0", "broker-1", "gateway", "stream", "web"},
		"production": {"broker-0", "broker-1", "gateway", "web"},
	} {
		entries, err := os.ReadDir(filepath.Join(out, c))
		if err != nil {
			t.Fatal(err)
		}
		var roles []string
		for _, e := range entries {
			if e.IsDir() {
				roles = append(roles, e.Name())
			}
		}
		if !slices.Equal(roles, want) {
			t.Errorf("the %q case rendered pods for %v, want %v", c, roles, want)
		}
		for _, role := range roles {
			// The pod's files, where the container sees /etc/deskway; its
			// state volume, with a golden image in the store.
			root := filepath.Join(out, c, role)
			body, err := os.ReadFile(filepath.Join(root, "etc", "deskway", "deskway.yaml"))
			if err != nil {
				t.Fatalf("%s/%s: %v", c, role, err)
			}
			state := t.TempDir()
			if err := os.MkdirAll(filepath.Join(state, "store"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(state, "store", "win11.img"), make([]byte, 1<<20), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := strings.NewReplacer("/etc/deskway/", filepath.Join(root, "etc", "deskway")+"/",
				"/var/lib/deskway", state).Replace(string(body))
			path := filepath.Join(t.TempDir(), "deskway.yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			if b, err := exec.Command(bin, "config", "validate", path).CombinedOutput(); err != nil {
				t.Errorf("the chart's %s configuration for %q is not a valid deskway configuration: %v\n%s\n%s", role, c, err, b, cfg)
			}
			// The brokers of the farm and of the production example share
			// PostgreSQL (production's whole URL is the mounted Secret file
			// broker.database names): deskway backup, which reads
			// broker.database as the broker does, leaves it to pg_dump.
			if strings.HasPrefix(role, "broker") && c != "defaults" {
				b, err := exec.Command(bin, "backup", "-c", path, filepath.Join(t.TempDir(), "copy.db")).CombinedOutput()
				if err == nil || !strings.Contains(string(b), "broker.database is PostgreSQL") {
					t.Errorf("deskway backup with the chart's broker configuration for %q: %v\n%s", c, err, b)
				}
				checkBrokerPeers(t, c, role, roles, root, []byte(cfg))
			}
		}
	}
}

// checkBrokerPeers checks broker pod role's configuration (cfg, read
// where the pod's files are under root) in a case whose broker pods are
// among roles: broker.peers names every other broker pod, by the name
// the chart's headless Service gives it, and not this one; and the
// certificate every broker serves verifies under the broker.peer_ca and
// broker.peer_server_name this one checks its peers with.
func checkBrokerPeers(t *testing.T, c, role string, roles []string, root string, cfg []byte) {
	t.Helper()
	var f struct {
		Broker struct {
			Peers          []string `yaml:"peers"`
			PeerCA         string   `yaml:"peer_ca"`
			PeerServerName string   `yaml:"peer_server_name"`
		} `yaml:"broker"`
	}
	if err := yaml.Unmarshal(cfg, &f); err != nil {
		t.Fatalf("%s/%s: %v", c, role, err)
	}
	var want []string
	for _, other := range roles {
		if strings.HasPrefix(other, "broker-") && other != role {
			want = append(want, fmt.Sprintf("https://desk-deskway-%s.desk-deskway-broker-peers:8444", other))
		}
	}
	if !slices.Equal(f.Broker.Peers, want) {
		t.Errorf("%s/%s: broker.peers %v, want the other broker pods %v", c, role, f.Broker.Peers, want)
	}
	caPEM, err := os.ReadFile(f.Broker.PeerCA)
	if err != nil {
		t.Fatalf("%s/%s: broker.peer_ca: %v", c, role, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatalf("%s/%s: broker.peer_ca %s holds no certificate", c, role, f.Broker.PeerCA)
	}
	served, err := os.ReadFile(filepath.Join(root, "etc", "deskway", "tls", "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(served)
	if block == nil {
		t.Fatalf("%s/%s: tls.crt holds no PEM block", c, role)
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: f.Broker.PeerServerName}); err != nil {
		t.Errorf("%s/%s: the certificate the brokers serve does not verify as broker.peer_server_name %q under broker.peer_ca: %v", c, role, f.Broker.PeerServerName, err)
	}
}
