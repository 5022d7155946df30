package gateway_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tsgclient"
)

// TestFarmReconnectGrantAtTheOtherNode: the reconnect grant of an
// expired token is the farm's: a client whose tunnel at node A closed
// reconnects through node B, and an expired token that never opened a
// tunnel is refused there too.
func TestFarmReconnectGrantAtTheOtherNode(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	nodes := startFarm(t, 2, func(c *config.Config) { c.Farm = &config.Farm{Database: config.NewSecret(dsn)} })
	a, b := nodes[0], nodes[1]
	db, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	tok := a.token(t, "alice", "127.0.0.1", a.echoPort, time.Second)
	unused := a.token(t, "alice", "127.0.0.1", a.echoPort, time.Second)
	c, err := dial(t, tokenFrom(a, tok, "127.0.0.1"), "127.0.0.1", a.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	echoRoundTrip(t, c, 100)
	c.Close()
	waitRecord(t, db, "node A ends the token's use", `SELECT count(*) = 1 AND count(open_node) = 0 AND count(closed_at) = 1 FROM deskway_token_uses`)
	waitExpired(t, b, tok)
	c, err = dial(t, tokenFrom(b, tok, "127.0.0.1"), "127.0.0.1", a.echoPort)
	if err != nil {
		t.Fatalf("the expired token's reconnect through node B: %v", err)
	}
	echoRoundTrip(t, c, 100)
	c.Close()
	refusedFor(t, b, tokenFrom(b, unused, "127.0.0.1"), a.echoPort, tsgu.EProxyCookieAuthenticationDenied,
		"an expired token that never opened a tunnel, at node B", "token has expired and opened no tunnel")
}

// farmBinaryNode is a gateway node run by the deskway binary, sharing
// the in-process nodes' token key, users and policies. Its admin API
// listens on a free port: the default, 9443, may be another test's.
const farmBinaryNode = `state_dir: %[1]s
log: {level: debug, format: json}
tls: {cert: %[2]s, key: %[3]s}
auth:
  token_key: "0123456789abcdef0123456789abcdef"
  users:
  - {name: alice, password: "Alice-Pass1", groups: [staff]}
gateway:
  listen: "127.0.0.1:%[4]d"
  connection_policies:
  - {name: staff, groups: [staff], max_tunnels_per_user: 4}
  resource_policies:
  - {name: loop, groups: [staff], hosts: [127.0.0.1]}
farm:
  database: "file:%[5]s"
admin: {listen: "127.0.0.1:%[6]d"}
`

// TestFarmNodeKilledFreesItsTokensWithinSeconds: node A, the deskway
// binary, holds two tunnels, one by a token still valid and one by a
// token that has expired meanwhile; A is killed with SIGKILL, so it
// ends nothing in the farm's record. Both clients reconnect through
// node B within seconds: the record frees a dead node's tokens once its
// beat stops, and counts the expired token's reconnect window from it.
func TestFarmNodeKilledFreesItsTokensWithinSeconds(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "deskway")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/deskway").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	serverTLS, clientTLS, cert, key := testkit.TLS(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := startOn(t, ln, serverTLS, clientTLS, func(c *config.Config) { c.Farm = &config.Farm{Database: config.NewSecret(dsn)} })

	dsnFile := filepath.Join(dir, "farm-db-url")
	if err := os.WriteFile(dsnFile, []byte(dsn), 0o600); err != nil {
		t.Fatal(err)
	}
	port := testkit.FreePort(t)
	cfgFile := filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(farmBinaryNode, dir, cert, key, port, dsnFile, testkit.FreePort(t))), 0o600); err != nil {
		t.Fatal(err)
	}
	nodeA := testkit.Start(t, nil, bin, "gateway", "-c", cfgFile)
	addrA := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addrA); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node A does not listen after 60 s:\n%s", nodeA.Log.String())
		}
	}
	viaA := func(tok string) tsgclient.Config {
		c := tokenFrom(b, tok, "127.0.0.1")
		c.Gateway = addrA
		return c
	}
	valid := b.token(t, "alice", "127.0.0.1", b.echoPort, time.Hour)
	short := b.token(t, "alice", "127.0.0.1", b.echoPort, time.Second)
	var conns []*tsgclient.Conn
	for _, tok := range []string{valid, short} {
		c, err := dial(t, viaA(tok), "127.0.0.1", b.echoPort)
		if err != nil {
			t.Fatalf("a tunnel at node A: %v\n%s", err, nodeA.Log.String())
		}
		defer c.Close()
		echoRoundTrip(t, c, 100)
		conns = append(conns, c)
	}
	waitExpired(t, b, short)
	refusedFor(t, b, tokenFrom(b, valid, "127.0.0.1"), b.echoPort, tsgu.EProxyCookieAuthenticationDenied,
		"the token open at node A, while A lives", "token is in use by an open tunnel (on this gateway farm)")

	if err := nodeA.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for _, c := range conns {
		buf := make([]byte, 1)
		if _, err := c.Read(buf); err == nil {
			t.Fatal("a tunnel at node A still relays after A was killed")
		}
	}
	for _, tc := range []struct{ what, tok string }{{"the valid token", valid}, {"the expired token", short}} {
		var lastErr error
		for deadline := killed.Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			c, err := dial(t, tokenFrom(b, tc.tok, "127.0.0.1"), "127.0.0.1", b.echoPort)
			if err == nil {
				echoRoundTrip(t, c, 100)
				c.Close()
				t.Logf("%s reconnected through node B %s after node A was killed", tc.what, time.Since(killed).Round(100*time.Millisecond))
				break
			}
			lastErr = err
			if time.Now().After(deadline) {
				t.Fatalf("%s: no reconnect through node B within 15 s of node A's death: %v", tc.what, lastErr)
			}
		}
	}
}
