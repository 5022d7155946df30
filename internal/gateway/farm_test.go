package gateway_test

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tsgclient"
)

// startFarm starts n gateway nodes, each naming the others as farm peers.
func startFarm(t *testing.T, n int, mod func(*config.Config)) []*harness {
	t.Helper()
	serverTLS, clientTLS, _, _ := testkit.TLS(t)
	lns := make([]net.Listener, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
	}
	nodes := make([]*harness, n)
	for i := range nodes {
		var peers []string
		for j, ln := range lns {
			if j != i {
				peers = append(peers, ln.Addr().String())
			}
		}
		nodes[i] = startOn(t, lns[i], serverTLS, clientTLS, func(c *config.Config) {
			c.Gateway.FarmPeers = peers
			if mod != nil {
				mod(c)
			}
		})
	}
	return nodes
}

// splitHalves makes a client's first connection (its OUT half) reach
// out and every later one (the IN half) reach in, as a load balancer
// with no stickiness may.
func splitHalves(out, in string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var n atomic.Int32
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		to := in
		if n.Add(1) == 1 {
			to = out
		}
		var d net.Dialer
		return d.DialContext(ctx, network, to)
	}
}

// TestFarmJoinsLegacyHalvesOnDifferentNodes: with the OUT half on one
// node and the IN half on another, the tunnel opens and relays, by NTLM
// and by token, and the IN half's node counts the forwarding; the
// pairing rules hold across nodes as on one.
func TestFarmJoinsLegacyHalvesOnDifferentNodes(t *testing.T) {
	nodes := startFarm(t, 3, nil)
	a, b := nodes[0], nodes[1]

	ntlm := a.cfg("alice", "Alice-Pass1", tsgclient.Legacy)
	ntlm.Dial = splitHalves(a.addr, b.addr)
	c, err := dial(t, ntlm, "127.0.0.1", a.echoPort)
	if err != nil {
		t.Fatalf("NTLM, halves on two nodes: %v", err)
	}
	echoRoundTrip(t, c, 100_000)
	c.Close()

	paa := a.cfg("", "", tsgclient.Legacy)
	paa.Token = a.token(t, "alice", "127.0.0.1", a.echoPort, time.Minute)
	paa.Dial = splitHalves(b.addr, a.addr)
	c, err = dial(t, paa, "127.0.0.1", a.echoPort)
	if err != nil {
		t.Fatalf("PAA, halves on two nodes: %v", err)
	}
	echoRoundTrip(t, c, 300)
	c.Close()

	if !strings.Contains(b.logs.String(), "legacy IN half forwarded to the farm peer holding its OUT half") {
		t.Fatal("node B did not log the forwarded IN half")
	}

	// Bob's IN half on node B, for alice's OUT half on node A: refused.
	out := rawLegacy(t, a, "RDG_OUT_DATA", "{farm-1}", "alice", "Alice-Pass1")
	if out == nil {
		t.Fatal("OUT half refused")
	}
	defer out.Close()
	const nowhere = "no RDG_OUT_DATA with this connection id is waiting on this node or its farm peers"
	refusedHalf(t, b, "{farm-1}", "bob", "Bob-Pass1", "bob's IN half on another node, for alice's OUT half",
		"farm peer holds the OUT half but refused to pair this IN half with it")
	// An IN half for an id no node holds: refused.
	refusedHalf(t, b, "{nobody}", "alice", "Alice-Pass1", "an IN half with no OUT half anywhere", nowhere)
	// Alice's own joins; a second IN for the same id, on the third node,
	// is refused.
	in := rawLegacy(t, b, "RDG_IN_DATA", "{farm-1}", "alice", "Alice-Pass1")
	if in == nil {
		t.Fatal("alice's IN half on another node refused")
	}
	defer in.Close()
	refusedHalf(t, nodes[2], "{farm-1}", "alice", "Alice-Pass1", "a second IN half, at a third node", nowhere)
}

// refusedHalf opens a legacy IN half at h with NTLM and wants it refused
// with 403 for reason, as h's log gives it.
func refusedHalf(t *testing.T, h *harness, id, user, pass, what, reason string) {
	t.Helper()
	before := strings.Count(h.logs.String(), reason)
	conn, resp, err := tsgclient.OpenLegacyHalf(context.Background(), h.cfg(user, pass, tsgclient.Legacy), "RDG_IN_DATA", id)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	conn.Close()
	if resp == nil {
		t.Fatalf("%s: taken, want 403", what)
	}
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("%s: %s, want 403", what, resp.Status)
	}
	waitLogged(t, reason, before+1, 2*time.Second, h)
}

// TestFarmClaimNeedsTheFarmKey: a client that speaks the node-to-node
// claim itself, without the farm key, takes no one's OUT half: a made-up
// MAC, a MAC replayed from another TLS session and no MAC are refused
// with 401, and the OUT half still joins its own IN half after.
func TestFarmClaimNeedsTheFarmKey(t *testing.T) {
	nodes := startFarm(t, 2, nil)
	a := nodes[0]
	out := rawLegacy(t, a, "RDG_OUT_DATA", "{victim}", "alice", "Alice-Pass1")
	if out == nil {
		t.Fatal("OUT half refused")
	}
	defer out.Close()
	// A claim signed with the farm key, as a node would sign it in one TLS
	// session, replayed in another: the keying material differs.
	cfg, _ := config.Parse([]byte(testConfig))
	key := gateway.FarmKey([]byte(cfg.Auth.TokenKey.Value()))
	first, err := tls.Dial("tcp", a.addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	st := first.ConnectionState()
	ekm, _ := st.ExportKeyingMaterial("EXPORTER-deskway-farm-legacy-in", nil, 32)
	first.Close()
	now := time.Now().Unix()
	replayed := farmMAC(key, ekm, "claim", "{victim}", "ntlm", "alice", "127.0.0.1", now)
	for name, mac := range map[string]string{
		"made up":  "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"none":     "",
		"replayed": replayed,
	} {
		status := rawClaim(t, a, "{victim}", "ntlm", "alice", "127.0.0.1", now, mac)
		if status != http.StatusUnauthorized {
			t.Errorf("%s MAC: answered %d, want 401", name, status)
		}
	}
	if !strings.Contains(a.logs.String(), "farm claim refused") {
		t.Error("the refusal was not logged")
	}
	in := rawLegacy(t, nodes[1], "RDG_IN_DATA", "{victim}", "alice", "Alice-Pass1")
	if in == nil {
		t.Fatal("after the forged claims, alice's own IN half was refused")
	}
	in.Close()
}

// farmMAC is a farm claim's MAC as docs/architecture.md gives it: HMAC-
// SHA256 with the farm key over length-prefixed fields.
func farmMAC(key, ekm []byte, dir, connID, method, user, remote string, at int64) string {
	m := hmac.New(sha256.New, key)
	for _, f := range []string{dir, string(ekm), connID, method, user, remote, strconv.FormatInt(at, 10)} {
		m.Write(binary.BigEndian.AppendUint32(nil, uint32(len(f))))
		m.Write([]byte(f))
	}
	return base64.RawStdEncoding.EncodeToString(m.Sum(nil))
}

// rawClaim sends a farm claim with the given MAC and returns the status.
func rawClaim(t *testing.T, h *harness, connID, method, user, remote string, at int64, mac string) int {
	t.Helper()
	conn, err := tls.Dial("tcp", h.addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /farm/legacy-in HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: deskway-legacy-in\r\nContent-Length: 0\r\n"+
		"Deskway-Farm-Connection-Id: %s\r\nDeskway-Farm-Method: %s\r\nDeskway-Farm-User: %s\r\nDeskway-Farm-Remote: %s\r\nDeskway-Farm-Time: %d\r\nDeskway-Farm-Mac: %s\r\n\r\n",
		connID, method, user, remote, at, mac)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestFarmCountsTokenUsesAcrossNodes: with farm.database and
// token_max_uses 1, a token opens its one tunnel once in the farm:
// replayed at another node it is
// refused while its tunnel is open and after; a token whose host could
// not be reached is given back and opens a tunnel at the other node.
func TestFarmCountsTokenUsesAcrossNodes(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	nodes := startFarm(t, 2, func(c *config.Config) {
		c.Farm = &config.Farm{Database: config.NewSecret(dsn)}
		one := 1
		c.Gateway.TokenMaxUses = &one
	})
	a, b := nodes[0], nodes[1]
	db, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	// refused dials node b with the token and wants it refused for
	// reason, as b's log gives it: the client is told the status alone.
	refused := func(cfg tsgclient.Config, why, reason string) {
		t.Helper()
		before := strings.Count(b.logs.String(), reason)
		_, err := dial(t, cfg, "127.0.0.1", a.echoPort)
		if statusOf(err) != tsgu.EProxyCookieAuthenticationDenied {
			t.Fatalf("%s: %v, want E_PROXY_COOKIE_AUTHENTICATION_ACCESS_DENIED", why, err)
		}
		waitLogged(t, reason, before+1, 2*time.Second, b)
	}
	tok := a.token(t, "alice", "127.0.0.1", a.echoPort, time.Minute)
	viaA := a.cfg("", "", tsgclient.Websocket)
	viaA.Token = tok
	c, err := dial(t, viaA, "127.0.0.1", a.echoPort)
	if err != nil {
		t.Fatalf("first use at node A: %v", err)
	}
	echoRoundTrip(t, c, 100)
	viaB := b.cfg("", "", tsgclient.Websocket)
	viaB.Token = tok
	refused(viaB, "the token, open at node A, at node B", "token is in use by an open tunnel (on this gateway farm)")
	c.Close()
	waitRecord(t, db, "node A ends the token's use", `SELECT count(*) = 1 AND count(open_node) = 0 FROM deskway_token_uses`)
	refused(viaB, "the token, used up at node A, at node B", "token has opened the 1 tunnels it may on this gateway farm")

	// A use whose host does not answer is given back: the record keeps
	// only the first token.
	dead := a.token(t, "alice", "127.0.0.1", 1, time.Minute)
	toDead := a.cfg("", "", tsgclient.Websocket)
	toDead.Token = dead
	if _, err := dial(t, toDead, "127.0.0.1", 1); statusOf(err) != tsgu.EProxyTSConnectFailed {
		t.Fatalf("a tunnel to a closed port: %v, want E_PROXY_TS_CONNECTFAILED", err)
	}
	waitRecord(t, db, "the farm's record holds the first token alone, closed",
		`SELECT count(*) = 1 AND count(open_node) = 0 AND min(uses) = 1 FROM deskway_token_uses`)
}

// waitRecord waits until query, on the farm's database, answers true,
// or fails after 5 s saying what it waited for.
func waitRecord(t *testing.T, db *pgx.Conn, what, query string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var ok bool
		if err := db.QueryRow(context.Background(), query).Scan(&ok); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not so after 5 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// paaHalf opens one legacy half with the PAA scheme and no credentials,
// as anyone may, and returns the status the gateway answered within a
// second, or 0 when it took the half without answering.
func paaHalf(t *testing.T, h *harness, method, id string) (net.Conn, int) {
	t.Helper()
	conn, status, err := openPAAHalf(h, method, id)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return conn, status
}

// openPAAHalf is paaHalf for a goroutine of its own, where t.Fatal would
// end only that goroutine and leave the test waiting for its answer.
func openPAAHalf(h *harness, method, id string) (net.Conn, int, error) {
	cfg := h.cfg("", "", tsgclient.Legacy)
	cfg.Token = "unchecked-until-tunnel-create"
	conn, resp, err := tsgclient.OpenLegacyHalf(context.Background(), cfg, method, id)
	if err != nil || resp == nil {
		return conn, 0, err
	}
	return conn, resp.StatusCode, nil
}

// TestFarmClaimsAreBounded: IN halves need no credentials, and each one
// whose OUT half is not on the node sends a claim to every peer. With a
// peer that never answers, the fifth IN half from one address while four
// claims hang is refused with 503 at once; IN halves with no connection
// id are refused with 400 and ask no peer.
func TestFarmClaimsAreBounded(t *testing.T) {
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hang.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := hang.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			defer c.Close() // held open, never answered
		}
	}()
	h := start(t, func(c *config.Config) { c.Gateway.FarmPeers = []string{hang.Addr().String()} })
	if _, status := paaHalf(t, h, "RDG_IN_DATA", ""); status != http.StatusBadRequest {
		t.Fatalf("an IN half with no connection id: status %d, want 400", status)
	}
	// Six at once: four claims hang until the handshake budget ends.
	statuses := make(chan int, 6)
	for i := 0; i < 6; i++ {
		go func() {
			c, status, err := openPAAHalf(h, "RDG_IN_DATA", fmt.Sprintf("{flood-%d}", i))
			if err != nil {
				t.Errorf("IN half %d: %v", i, err)
			} else {
				defer c.Close()
			}
			statuses <- status
		}()
	}
	refused := 0
	for i := 0; i < 6; i++ {
		if <-statuses == http.StatusServiceUnavailable {
			refused++
		}
	}
	if refused != 2 {
		t.Fatalf("%d of 6 IN halves refused while 4 claims hang, want 2", refused)
	}
	// The peer's count is read a second after the six were sent (the
	// wait for an answer of the four that hang), and longer after the
	// IN half with no connection id was answered: a claim of its own
	// would be a fifth.
	if n := accepted.Load(); n != 4 {
		t.Fatalf("the peer got %d claims, want the 4 of the six IN halves with an id and none of the one without", n)
	}
}

// TestFarmParkedOUTHalfDoesNotBlock: someone who learnt alice's
// connection id parks an OUT half under it on node B; alice's IN half,
// arriving at B, still joins her OUT half on node A.
func TestFarmParkedOUTHalfDoesNotBlock(t *testing.T) {
	nodes := startFarm(t, 2, nil)
	a, b := nodes[0], nodes[1]
	out := rawLegacy(t, a, "RDG_OUT_DATA", "{alice-1}", "alice", "Alice-Pass1")
	if out == nil {
		t.Fatal("alice's OUT half refused")
	}
	defer out.Close()
	parked, status := paaHalf(t, b, "RDG_OUT_DATA", "{alice-1}")
	if status != http.StatusOK {
		t.Fatalf("the parked OUT half: status %d", status)
	}
	defer parked.Close()
	in := rawLegacy(t, b, "RDG_IN_DATA", "{alice-1}", "alice", "Alice-Pass1")
	if in == nil {
		t.Fatal("alice's IN half was refused because of the OUT half parked at node B")
	}
	in.Close()
}

// TestFarmPeerWithAnotherCertificate: a node that holds the farm key but
// serves another certificate than the farm's is not sent IN halves: the
// link between nodes carries connection ids and user names, and a
// certificate that differs is what a man in the middle shows.
func TestFarmPeerWithAnotherCertificate(t *testing.T) {
	serverTLS, clientTLS, _, _ := testkit.TLS(t)
	otherTLS, _, _, _ := testkit.TLS(t)
	lnA, _ := net.Listen("tcp", "127.0.0.1:0")
	lnB, _ := net.Listen("tcp", "127.0.0.1:0")
	a := startOn(t, lnA, otherTLS, clientTLS, func(c *config.Config) { c.Gateway.FarmPeers = []string{lnB.Addr().String()} })
	b := startOn(t, lnB, serverTLS, clientTLS, func(c *config.Config) { c.Gateway.FarmPeers = []string{lnA.Addr().String()} })
	aCfg := a.cfg("alice", "Alice-Pass1", tsgclient.Legacy)
	aCfg.TLS = &tls.Config{InsecureSkipVerify: true}
	out, resp, err := tsgclient.OpenLegacyHalf(context.Background(), aCfg, "RDG_OUT_DATA", "{cert-1}")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("OUT half at node A: %v %v", resp, err)
	}
	defer out.Close()
	if in := rawLegacy(t, b, "RDG_IN_DATA", "{cert-1}", "alice", "Alice-Pass1"); in != nil {
		in.Close()
		t.Fatal("node B carried an IN half to a peer serving another certificate")
	}
	if !strings.Contains(b.logs.String(), "serves another certificate") {
		t.Fatal("node B did not say why it did not ask the peer")
	}
}

// TestFarmPeersByName: a farm peer named by a host name is every address
// the name resolves to (a Kubernetes headless Service lists the gateway
// pods so); here localhost, whose ::1 answers nothing.
func TestFarmPeersByName(t *testing.T) {
	serverTLS, clientTLS, _, _ := testkit.TLS(t)
	lnA, _ := net.Listen("tcp", "127.0.0.1:0")
	lnB, _ := net.Listen("tcp", "127.0.0.1:0")
	name := func(ln net.Listener) string {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		return "localhost:" + port
	}
	a := startOn(t, lnA, serverTLS, clientTLS, func(c *config.Config) { c.Gateway.FarmPeers = []string{name(lnB)} })
	b := startOn(t, lnB, serverTLS, clientTLS, func(c *config.Config) { c.Gateway.FarmPeers = []string{name(lnA)} })
	cfg := a.cfg("alice", "Alice-Pass1", tsgclient.Legacy)
	cfg.Dial = splitHalves(a.addr, b.addr)
	c, err := dial(t, cfg, "127.0.0.1", a.echoPort)
	if err != nil {
		t.Fatalf("halves on two nodes that name each other by host name: %v", err)
	}
	echoRoundTrip(t, c, 1000)
	c.Close()
}

// TestFarmListsAndDisconnectsEveryNodesTunnels: with farm.database, the
// admin API of any node lists every node's tunnels, with the node that
// holds each, and disconnects one held by another node; its token then
// opens no tunnel at any node (the client's reconnect is refused).
func TestFarmListsAndDisconnectsEveryNodesTunnels(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	nodes := startFarm(t, 2, func(c *config.Config) { c.Farm = &config.Farm{Database: config.NewSecret(dsn)} })
	a, b := nodes[0], nodes[1]
	tok := a.token(t, "alice", "127.0.0.1", a.echoPort, time.Minute)
	viaA := a.cfg("", "", tsgclient.Websocket)
	viaA.Token = tok
	c, err := dial(t, viaA, "127.0.0.1", a.echoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echoRoundTrip(t, c, 100)

	admin := httptest.NewServer(b.srv.AdminHandler())
	defer admin.Close()
	type list struct {
		Tunnels []gateway.TunnelInfo `json:"tunnels"`
	}
	var at gateway.TunnelInfo
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get(admin.URL + "/api/v1/gateway/tunnels")
		if err != nil {
			t.Fatal(err)
		}
		var l list
		_ = json.NewDecoder(resp.Body).Decode(&l)
		resp.Body.Close()
		if len(l.Tunnels) == 1 && l.Tunnels[0].User == "alice" && l.Tunnels[0].Node != "" {
			at = l.Tunnels[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node B's admin API does not list alice's tunnel at node A: %+v", l)
		}
	}
	req, _ := http.NewRequest("DELETE", fmt.Sprintf("%s/api/v1/gateway/tunnels/%d?node=%s", admin.URL, at.ID, at.Node), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("disconnect at another node: %d", resp.StatusCode)
	}
	ended := make(chan error, 1)
	go func() { _, err := io.ReadAll(c); ended <- err }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("alice's tunnel at node A did not end")
	}
	// The line is written as the tunnel ends, which may be just after
	// the client read its end: wait for it.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(a.logs.String(), "tunnel disconnected by administrator at another node"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("node A did not log the disconnect")
		}
	}
	db, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	waitRecord(t, db, "node A spends the token", `SELECT count(*) = 1 AND count(open_node) = 0 FROM deskway_token_uses WHERE uses > 3`)
	viaB := b.cfg("", "", tsgclient.Websocket)
	viaB.Token = tok
	if _, err := dial(t, viaB, "127.0.0.1", a.echoPort); statusOf(err) != tsgu.EProxyCookieAuthenticationDenied {
		t.Fatalf("the client reconnecting through node B after the disconnect: %v, want E_PROXY_COOKIE_AUTHENTICATION_ACCESS_DENIED", err)
	}
	waitLogged(t, "an administrator disconnected this token's tunnel", 1, 2*time.Second, b)
}
