package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/testkit"
)

// peerReloadNode is one of two brokers on one PostgreSQL database; %[7]s
// is its peer settings, if any.
const peerReloadNode = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: ["e2e-admin-token"]}
tls: {cert: %[3]s, key: %[4]s}
auth:
  token_key: "e2e-token-key-0123456789abcdef0123456789"
broker:
  listen: "%[5]s"
  database: "%[6]s"
  gateway: "gateway.example.test:443"
  frontend_tokens: [e2e-portal-token]
  delivery_groups:
  - {name: desk, groups: [staff], logon_limit: 10}
%[7]s`

// TestReloadAddsAPeerBroker: broker A starts without B in broker.peers;
// SIGHUP with B added and a peer_ca that is not there is refused, naming
// it; with the CA there (and the name B's certificate holds in place of
// the address A reaches it at) B is in force, logged and in the audit
// trail; PostgreSQL stops; B places u1, every report of
// which goes to B; u1 launches again at A, which asks B and sends u1
// back to B's session rather than placing a second one. Before peers
// were reloaded, A asked nobody until restarted, and placed a second.
func TestReloadAddsAPeerBroker(t *testing.T) {
	parallel(t) // its own PostgreSQL, brokers and admin ports, all free ones
	bin := build(t)
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	// A CA-signed certificate for localhost and 127.0.0.1 only: B listens
	// on 127.0.0.2, which A can check B's certificate for only as
	// broker.peer_server_name says.
	caDir, cert, key := testkit.CA(t)
	type node struct {
		cfg, listen string
		admin       int
		p           *testkit.Process
	}
	write := func(n *node, peers string) {
		t.Helper()
		body := fmt.Sprintf(peerReloadNode, filepath.Dir(n.cfg), n.admin, cert, key, n.listen, dsn, peers)
		if err := os.WriteFile(n.cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := func(n *node) {
		t.Helper()
		n.p = testkit.Start(t, nil, bin, "broker", "-c", n.cfg)
		if err := testkit.WaitPort(n.listen, 20*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, n.p.Log.String())
		}
	}
	// Four different ports: FreePort twice may give the same (in CI, both
	// admin listeners got one port, and A could not start).
	ports := testkit.FreePorts(t, 4)
	a := &node{cfg: filepath.Join(t.TempDir(), "deskway.yaml"), listen: fmt.Sprintf("127.0.0.1:%d", ports[0]), admin: ports[1]}
	b := &node{cfg: filepath.Join(t.TempDir(), "deskway.yaml"), listen: fmt.Sprintf("127.0.0.2:%d", ports[2]), admin: ports[3]}
	write(b, "")
	start(b) // first: it migrates the database
	insecure := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	atA := &brokerclient.Client{Base: "https://" + a.listen, HTTP: insecure}
	atB := &brokerclient.Client{Base: "https://" + b.listen, HTTP: insecure}
	ctx := context.Background()

	// h1 registers and reports at B; A, started after, reads it from the
	// database.
	out, err := exec.Command(bin, "token", "join", "-c", b.cfg, "--group", "desk", "--ttl", "1h").CombinedOutput()
	if err != nil {
		t.Fatalf("deskway token join: %v %s", err, out)
	}
	reg, err := atB.Register(ctx, strings.TrimSpace(string(out)), brokerapi.RegisterRequest{Name: "h1", Address: "10.0.0.1", Port: 3389})
	if err != nil {
		t.Fatal(err)
	}
	beat := func(sessions ...brokerapi.Session) {
		t.Helper()
		if _, err := atB.Heartbeat(ctx, reg.Credential, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9, Sessions: sessions}); err != nil {
			t.Fatalf("h1's heartbeat at B: %v", err)
		}
	}
	beat()
	write(a, "")
	start(a)
	if strings.Contains(a.p.Log.String(), "peer brokers") {
		t.Fatalf("A lists peers before it has any:\n%s", a.p.Log.String())
	}

	peers := func(ca string) string {
		return fmt.Sprintf("  peers: [\"https://%s\"]\n  peer_ca: %s\n  peer_server_name: localhost\n  peer_timeout: 2s\n", b.listen, ca)
	}
	reload := func(want string) {
		t.Helper()
		if err := syscall.Kill(a.p.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(a.p.Log.String(), want); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in A's log after SIGHUP:\n%s", want, a.p.Log.String())
			}
		}
	}
	// A peer CA that is not there refuses the whole reload, saying why.
	write(a, peers(filepath.Join(caDir, "no-such-ca.pem")))
	reload("configuration reload refused")
	if !strings.Contains(a.p.Log.String(), "broker.peer_ca") || strings.Contains(a.p.Log.String(), "peer brokers reloaded") {
		t.Fatalf("A's refusal of a missing broker.peer_ca does not name it, or A took the peers anyway:\n%s", a.p.Log.String())
	}
	write(a, peers(filepath.Join(caDir, "ca-cert.pem")))
	reload("configuration reloaded")
	if !strings.Contains(a.p.Log.String(), "peer brokers reloaded") {
		t.Fatalf("A's log does not say its peers changed:\n%s", a.p.Log.String())
	}
	wantAction := fmt.Sprintf("broker peers reloaded: broker.peers none → [https://%s]; broker.peer_timeout 1s → 2s", b.listen)
	if e := auditEntry(t, a.admin, "broker peers"); e.Action != wantAction || e.Actor != "reload (SIGHUP)" || e.Source != "SIGHUP" || e.Status != http.StatusOK {
		t.Fatalf("A's audit entry of the reload: %+v; want action %q by reload (SIGHUP)", e, wantAction)
	}

	if err := pg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	launch := func(c *brokerclient.Client) *brokerapi.LaunchResponse {
		t.Helper()
		res, _, err := c.Launch(ctx, brokerclient.Bearer("e2e-portal-token"), brokerapi.LaunchRequest{DeliveryGroup: "desk", User: "u1", Groups: []string{"staff"}})
		if err != nil {
			t.Fatalf("u1's launch at %s with the database down: %v", c.Base, err)
		}
		return res
	}
	first := launch(atB)
	beat(brokerapi.Session{User: "u1", State: "active"})
	second := launch(atA)
	if !second.Reconnect || second.SessionID != first.SessionID || second.Host != first.Host {
		t.Fatalf("u1 placed by B as %s on %s, launched again at A (B added to its peers by a reload) with the database down: reconnect %t, session %s on %s; want a reconnect to B's session",
			first.SessionID, first.Host, second.Reconnect, second.SessionID, second.Host)
	}
	if !strings.Contains(a.p.Log.String(), "a peer broker holds the user's session") {
		t.Errorf("A's log does not say B held u1's session:\n%s", a.p.Log.String())
	}
}

// auditLine is one entry of the admin API's audit trail.
type auditLine struct {
	Actor, Action, Source string
	Status                int
}

// auditEntry is the newest entry of the broker's audit trail (read on its
// admin API, port admin) whose action holds what.
func auditEntry(t *testing.T, admin int, what string) auditLine {
	t.Helper()
	req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/api/v1/audit?limit=20", admin), nil)
	req.Header.Set("Authorization", "Bearer e2e-admin-token")
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var trail struct{ Entries []auditLine }
	if err := json.NewDecoder(resp.Body).Decode(&trail); err != nil {
		t.Fatal(err)
	}
	for _, x := range trail.Entries {
		if strings.Contains(x.Action, what) {
			return x
		}
	}
	t.Fatalf("no %q in the audit trail: %+v", what, trail.Entries)
	return auditLine{}
}
