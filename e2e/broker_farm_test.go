package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/testkit"
)

// brokerFarmNode is one of two brokers sharing a PostgreSQL database.
const brokerFarmNode = `state_dir: %[1]s
log: {level: debug, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: ["e2e-admin-token"]}
tls: {cert: %[3]s, key: %[4]s}
auth:
  token_key: "e2e-token-key-0123456789abcdef0123456789"
broker:
  listen: "127.0.0.1:%[5]d"
  database: "%[6]s"
  gateway: "gateway.example.test:443"
  heartbeat_interval: 1s
  heartbeat_timeout: 30s
  busy_wait: 0s
  frontend_tokens: [e2e-portal-token]
  proxy_protocol_from: [127.0.0.1]   # HAProxy, on this host
  delivery_groups:
  - {name: desk, groups: [staff], session_limit: 3, logon_limit: 10}
`

// TestBrokersBehindHAProxy: two brokers share one PostgreSQL database
// behind HAProxy (deploy/haproxy/broker-farm.cfg as shipped, addresses
// changed: round robin, no persistence, PROXY headers, a stats socket). Four session hosts register through it; then 20 users
// launch at once, each on a connection of its own, so the launches
// alternate between the brokers. Both brokers place sessions, exactly
// the 12 places there are (4 hosts, 3 sessions each) are given, no host
// gets more than 3, and the other launches are told there is no room.
func TestBrokersBehindHAProxy(t *testing.T) {
	testkit.Require(t, "haproxy")
	bin := build(t)
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	_, _, cert, key := testkit.TLS(t)
	// The nodes' listeners, their admin listeners and the balancer's: all
	// different (FreePort twice may give the same).
	free := testkit.FreePorts(t, 5)
	ports, admins := free[:2], free[2:4]
	var nodes []*testkit.Process
	var cfg0 string
	for i, port := range ports {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "deskway.yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(brokerFarmNode, dir, admins[i], cert, key, port, dsn)), 0o600); err != nil {
			t.Fatal(err)
		}
		if cfg0 == "" {
			cfg0 = cfg
		}
		nodes = append(nodes, testkit.Start(t, nil, bin, "broker", "-c", cfg))
		// One at a time: the first migrates the shared database.
		if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// The shipped file with only its addresses changed: HAProxy reaches
	// the brokers from 127.0.0.1, the address they trust for PROXY headers.
	lbAddr := fmt.Sprintf("127.0.0.1:%d", free[4])
	_, sock := shippedHAProxy(t, "broker-farm.cfg", lbAddr, "bind :8444", "bind "+lbAddr,
		"10.0.0.21:8444", fmt.Sprintf("127.0.0.1:%d", ports[0]), "10.0.0.22:8444", fmt.Sprintf("127.0.0.1:%d", ports[1]))
	if info := haproxyCommand(t, sock, "show info"); !strings.Contains(info, "Name: HAProxy") {
		t.Fatalf("the stats socket answered show info with %q", info)
	}

	// A connection per request: round robin then alternates the brokers.
	// The client connects from 127.0.0.3, so that the brokers' logs tell
	// it from HAProxy (127.0.0.1).
	from := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3)}}
	client := &brokerclient.Client{Base: "https://" + lbAddr, HTTP: &http.Client{Timeout: 20 * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: from.DialContext, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
	out, err := exec.Command(bin, "token", "join", "-c", cfg0, "--group", "desk", "--ttl", "1h").CombinedOutput()
	if err != nil {
		t.Fatalf("deskway token join: %v %s", err, out)
	}
	join := strings.TrimSpace(string(out))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var beats sync.WaitGroup
	defer beats.Wait()
	defer cancel()
	for h := 1; h <= 4; h++ {
		name := fmt.Sprintf("host%d", h)
		reg, err := client.Register(ctx, join, brokerapi.RegisterRequest{Name: name, Address: fmt.Sprintf("10.0.0.%d", h), Port: 3389})
		if err != nil {
			t.Fatalf("registering %s: %v", name, err)
		}
		beat := func() error {
			_, err := client.Heartbeat(ctx, reg.Credential, brokerapi.Heartbeat{Host: name, CPU: 0.1, Memory: 0.2, DiskIdle: 0.9, DiskLatencyMS: 2})
			return err
		}
		if err := beat(); err != nil {
			t.Fatalf("heartbeat of %s: %v", name, err)
		}
		beats.Add(1)
		go func() {
			defer beats.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
					_ = beat()
				}
			}
		}()
	}

	type result struct {
		host   string
		status int
	}
	results := make(chan result, 20)
	var wg sync.WaitGroup
	for u := 1; u <= 20; u++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lr, _, err := client.Launch(ctx, brokerclient.Bearer("e2e-portal-token"),
				brokerapi.LaunchRequest{DeliveryGroup: "desk", User: fmt.Sprintf("user%02d", u), Groups: []string{"staff"}})
			if err != nil {
				se, ok := err.(*brokerclient.StatusError)
				if !ok {
					t.Errorf("user%02d: %v", u, err)
					return
				}
				results <- result{status: se.Status}
				return
			}
			results <- result{host: lr.Host, status: http.StatusOK}
		}()
	}
	wg.Wait()
	close(results)
	perHost := map[string]int{}
	placed, statuses := 0, map[int]int{}
	for r := range results {
		statuses[r.status]++
		if r.status == http.StatusOK {
			placed++
			perHost[r.host]++
		}
	}
	t.Logf("launch answers by status: %v; sessions per host: %v", statuses, perHost)
	if placed != 12 {
		t.Errorf("%d launches placed, want the 12 places of 4 hosts with 3 sessions each", placed)
	}
	for h, n := range perHost {
		if n > 3 {
			t.Errorf("%s got %d sessions, past its limit of 3", h, n)
		}
	}
	if placed+statuses[http.StatusServiceUnavailable] != 20 {
		t.Errorf("launches that were not placed got other answers than 503: %v", statuses)
	}
	// A wrong password through the balancer: the broker that refuses it
	// names the client (127.0.0.3), from the PROXY header, not HAProxy
	// (127.0.0.1).
	_, _, err = client.Launch(ctx, brokerclient.Basic("nobody", "wrong"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	var se *brokerclient.StatusError
	if !errors.As(err, &se) || se.Status != http.StatusUnauthorized || se.Message != "wrong user name or password" {
		t.Fatalf("a launch with a wrong password: %v, want 401 wrong user name or password", err)
	}
	// The refusal's own line names the client. The brokers' logs reach
	// the test through pipes, so the line may come after the answer.
	var refusal string
	for deadline := time.Now().Add(10 * time.Second); refusal == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, n := range nodes {
			for _, line := range strings.Split(n.Log.String(), "\n") {
				if strings.Contains(line, `"error":"wrong user name or password"`) {
					refusal = line
				}
			}
		}
	}
	if !strings.Contains(refusal, `"remote":"127.0.0.3:`) {
		t.Errorf("the brokers logged HAProxy's address, or none, for a client's refused request, not the client's: %q", refusal)
	}
	// The upgrade steps take a broker out on the stats socket.
	haproxyCommand(t, sock, "set server brokers/broker1 state drain")
	if st := serverStatus(t, sock, "brokers", "broker1"); st != "DRAIN" {
		t.Errorf("after set server brokers/broker1 state drain, broker1 is %s", st)
	}
	for i, n := range nodes {
		if got := strings.Count(n.Log.String(), `"msg":"launch"`); got == 0 {
			t.Errorf("broker %d placed no launch: round robin did not alternate, so the test proved little", i+1)
		} else {
			t.Logf("broker %d placed %d launches", i+1, got)
		}
	}
}
