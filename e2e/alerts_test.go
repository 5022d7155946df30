package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

const alertsConfig = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: [admin-tok]}
auth:
  token_key: alerts-test-key-0123456789abcdef012345678
  users:
  - {name: alice, password: "Alice-Pass1", groups: [staff]}
farm:
  database: "%[5]s"
gateway:
  listen: "127.0.0.1:%[3]d"
  connection_policies: [{name: staff, groups: [staff]}]
  resource_policies: [{name: hosts, groups: [staff], hosts: [127.0.0.1]}]
broker:
  listen: "127.0.0.1:%[4]d"
  gateway: "127.0.0.1:%[3]d"
  delivery_groups:
  - {name: desk, groups: [staff]}
stream:
  listen: "127.0.0.1:%[6]d"
  tls: "off"
  clients: open
  vdisks:
  - {name: golden, base: %[7]s}
`

// TestAlertSeriesExistBeforeTheirFirstEvent: every series the alert table
// of docs/operations.md names is on /metrics of a process that has just
// started and seen no traffic, so that rate() sees the first failure and
// an alert reads 0, not "no data".
func TestAlertSeriesExistBeforeTheirFirstEvent(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "## What to alert on")
	if !ok {
		t.Fatal(`docs/operations.md has no "What to alert on" section`)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	// A metric and, when the alert selects on it, its label matcher:
	// deskway_x_total{result="failed"} or {result=~"a|b"}.
	series := regexp.MustCompile(`(deskway_[a-z_]+?)(?:_bucket)?(?:\{(\w+)(=~?)"([^"]+)"\})?[\[)\x60 ]`)
	found := series.FindAllStringSubmatch(table, -1)
	if len(found) < 8 {
		t.Fatalf("found %d series in the alert table, want its 8 or more:\n%s", len(found), table)
	}

	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	if err := os.WriteFile(base, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	ports := testkit.FreePorts(t, 4) // FreePort twice may give the same
	adminPort := ports[0]
	cfg := filepath.Join(dir, "deskway.yaml")
	// A farm node, so that the farm's alerts are there too.
	farmDB := testkit.StartPostgres(t).NewDB(t)
	body := fmt.Sprintf(alertsConfig, filepath.Join(dir, "state"), adminPort, ports[1], ports[2],
		farmDB, ports[3], base)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testkit.Start(t, nil, bin, "run", "-c", cfg)
	admin := fmt.Sprintf("127.0.0.1:%d", adminPort)
	if err := testkit.WaitPort(admin, 20*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, p.Log.String())
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	var metrics string
	// Every role registers its series as it starts: wait for the last.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		req, _ := http.NewRequest("GET", "https://"+admin+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer admin-tok")
		if resp, err := client.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			metrics = string(b)
		}
		if strings.Contains(metrics, "deskway_stream_boots") && strings.Contains(metrics, "deskway_broker_database_unreachable") &&
			strings.Contains(metrics, "deskway_gateway_farm_database_unreachable") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the roles' metrics never all appeared:\n%s\n%s", metrics, p.Log.String())
		}
	}
	for _, m := range found {
		name, label, op, value := m[1], m[2], m[3], m[4]
		if label == "" {
			if !regexp.MustCompile(`(?m)^` + name + `(_bucket)?[{ ]`).MatchString(metrics) {
				t.Errorf("the alert table's %s is not on /metrics of a fresh process", name)
			}
			continue
		}
		values := []string{value}
		if op == "=~" {
			values = strings.Split(value, "|")
		}
		for _, v := range values {
			if !regexp.MustCompile(`(?m)^` + name + `\{[^}]*` + label + `="` + regexp.QuoteMeta(v) + `"[^}]*\} 0$`).MatchString(metrics) {
				t.Errorf("the alert table's %s{%s=%q} is not at 0 on /metrics of a fresh process", name, label, v)
			}
		}
	}
}
