package broker_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// TestOutageLaunchAtTheBrokerThatHeardNothing is the last way `deskway
// bench faults --scenario broker` gave a user two sessions: broker B
// placed u1, and every report of that host, the logon included, went to
// B; PostgreSQL was down; u1 launched again at A, whose copy had no
// session of u1, and A placed a second one. With each broker listing the
// other in broker.peers, A asks B first and sends u1 back to the session
// B holds. Both ways B may hold it are run: placed before the outage (A's
// copy reloads other brokers' sessions once a minute) and placed in it.
func TestOutageLaunchAtTheBrokerThatHeardNothing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inOutage bool
	}{{"placed before the outage", false}, {"placed in the outage", true}} {
		t.Run(tc.name, func(t *testing.T) {
			pg := testkit.StartPostgres(t)
			dsn := pg.NewDB(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a, b := peerBrokers(t, dsn)
			var first *brokerapi.LaunchResponse
			placeAtB := func() {
				first = b.launch(t, "u1")
				b.event(t, "u1", store.Active)
				b.beat(t, first.Host, map[string]string{"u1": store.Active})
			}
			if !tc.inOutage {
				placeAtB()
			}
			if err := pg.Kill(context.Background()); err != nil {
				t.Fatal(err)
			}
			maintain(t, ctx, a.r.b)
			maintain(t, ctx, b.r.b)
			if tc.inOutage {
				placeAtB()
			}
			second := a.launch(t, "u1")
			if !second.Reconnect || second.Host != first.Host || second.SessionID != first.SessionID {
				t.Fatalf("u1 placed by B as %s on %s, every report of it to B, launched again at A in the outage: reconnect %t, session %q on %s; want a reconnect to %s on %s",
					first.SessionID, first.Host, second.Reconnect, second.SessionID, second.Host, first.SessionID, first.Host)
			}
			if !strings.Contains(a.r.logs.String(), "a peer broker holds the user's session") {
				t.Errorf("A's log does not say B held u1's session:\n%s", a.r.logs.String())
			}
			if err := pg.Restart(context.Background()); err != nil {
				t.Fatal(err)
			}
			// Both journals written back (B's holds u1's placement), then
			// read.
			a.settled(t)
			b.settled(t)
			for _, w := range []*world{a, b} {
				if got := w.settled(t); got["u1"] != store.Active {
					t.Errorf("%s: u1's live sessions after the outage: %v, want one, active", w.name, got)
				}
			}
			all, err := a.r.store.Sessions(context.Background(), "u1", true, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != 1 || all[0].ID != first.SessionID {
				t.Errorf("u1's sessions after the write-back: %+v, want only %s", all, first.SessionID)
			}
		})
	}
}

// TestOutageLaunchOnAHostOnlyThePeerKnows: a host that registered
// through one broker shortly before PostgreSQL stopped is in no other
// broker's copy (each reloads the hosts every 5 s), so a session on it
// could not draw the user's next launch there: the copy knew the session
// (its own placement, made by the database) or learned it from the peer,
// but not the host, and placed a second session elsewhere (`deskway
// bench faults --scenario link` at small scale: five users). The peer's
// answer carries the host as it knows it.
func TestOutageLaunchOnAHostOnlyThePeerKnows(t *testing.T) {
	for _, tc := range []struct {
		name string
		// B places u1 (online) on h3, which registered through the
		// broker where u1 does not launch again.
		relaunchAtA bool
	}{
		{"placed by B on a host registered at B, launched again at A", true},
		{"placed by B on a host registered at A, launched again at B", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := testkit.StartPostgres(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a, b := peerBrokers(t, pg.NewDB(t))
			registrar := b
			if !tc.relaunchAtA {
				registrar = a
			}
			cred := registrar.r.agent("h3", "desk", "")
			a.creds["h3"], b.creds["h3"] = cred, cred
			// Only h3 takes new sessions, as far as the database knows.
			for _, h := range []string{"h1", "h2"} {
				if err := a.r.store.SetAdminDrain(context.Background(), h, true); err != nil {
					t.Fatal(err)
				}
			}
			first := b.launch(t, "u1")
			if first.Host != "h3" {
				t.Fatalf("u1 placed on %s, want h3", first.Host)
			}
			if err := pg.Kill(context.Background()); err != nil {
				t.Fatal(err)
			}
			maintain(t, ctx, a.r.b)
			maintain(t, ctx, b.r.b)
			again := a
			if !tc.relaunchAtA {
				again = b
			}
			second := again.launch(t, "u1")
			if !second.Reconnect || second.Host != "h3" || second.SessionID != first.SessionID {
				t.Fatalf("u1 on h3 as %s, launched again at %s in the outage: reconnect %t, session %q on %s; want a reconnect to %s on h3",
					first.SessionID, again.name, second.Reconnect, second.SessionID, second.Host, first.SessionID)
			}
		})
	}
}

// TestOutageReportFromAHostOnlyThePeerKnows: a host that registered
// through broker A shortly before PostgreSQL stopped is in no copy but
// A's; its reports, through the balancer, reach B too. B refused them
// with 404 ("not registered: register it with a join token"), which has
// the agent drop its credential and register with its join token, which
// no broker can take in an outage (seen in the broker logs of `deskway
// bench faults --scenario link`). With peers, B asks A for the host and
// takes the report; without, it answers 503 and the agent reports again.
func TestOutageReportFromAHostOnlyThePeerKnows(t *testing.T) {
	for _, withPeers := range []bool{true, false} {
		t.Run(fmt.Sprint("peers ", withPeers), func(t *testing.T) {
			pg := testkit.StartPostgres(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var a, b *world
			if withPeers {
				a, b = peerBrokers(t, pg.NewDB(t))
			} else {
				a, b = twoBrokers(t, pg.NewDB(t))
			}
			cred := a.r.agent("h3", "desk", "")
			if err := pg.Kill(context.Background()); err != nil {
				t.Fatal(err)
			}
			maintain(t, ctx, a.r.b)
			maintain(t, ctx, b.r.b)
			_, err := b.r.client.Heartbeat(context.Background(), cred, brokerapi.Heartbeat{Host: "h3", DiskIdle: 0.9,
				Sessions: []brokerapi.Session{{User: "u1", State: store.Active}}})
			switch {
			case withPeers && err != nil:
				t.Fatalf("h3's heartbeat at B in the outage, h3 registered at A, A a peer of B: %v; want it taken", err)
			case !withPeers && status(err) != http.StatusServiceUnavailable:
				t.Fatalf("h3's heartbeat at B in the outage, h3 registered at A, no peers: %v; want 503 (report again), not 404 (register again)", err)
			}
			if !withPeers {
				return
			}
			// B now holds h3 and u1's session there.
			b.host["u1"] = "h3"
			second := b.launch(t, "u1")
			if !second.Reconnect || second.Host != "h3" {
				t.Fatalf("u1 reported on h3 to B, launched at B: reconnect %t on %s; want a reconnect on h3", second.Reconnect, second.Host)
			}
		})
	}
}

// TestPeerQuestionNeedsAPeerToken: the question brokers ask each other
// tells who has a session where, so the broker answers it only to a
// peer token its own key signed, naming the user asked about. A stranger
// without one, or with any other credential the broker hands out or
// takes, learns nothing.
func TestPeerQuestionNeedsAPeerToken(t *testing.T) {
	r := newRig(t, "", nil)
	cred := r.agent("h1", "desk", "")
	res, err := r.launch(brokerclient.Bearer("frontend-token"), brokerapi.LaunchRequest{DeliveryGroup: "desk", User: "u1", Groups: []string{"bench"}})
	if err != nil {
		t.Fatal(err)
	}
	// No credential at all, as a raw request.
	req, err := http.NewRequest(http.MethodPost, r.srv.URL+"/api/v1/peer/sessions", strings.NewReader(`{"user":"u1"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("peer question without a credential: %d, want 401", resp.StatusCode)
	}
	gateway, err := r.tokens.Mint("u1", nil, "h1.lan", 3389, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	strange, err := auth.NewTokens([]byte("another-key-0123456789abcdef0123456789"), nil)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := strange.MintPeer("u1", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	forU2, err := r.tokens.MintPeer("u2", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what, token string
		want        int
	}{
		{"a front-end token", "frontend-token", http.StatusUnauthorized},
		{"a gateway token for u1", gateway, http.StatusUnauthorized},
		{"h1's agent credential", cred, http.StatusUnauthorized},
		{"a peer token signed with another key", forged, http.StatusUnauthorized},
		{"a peer token for u2", forU2, http.StatusForbidden},
	} {
		got, err := r.client.PeerSessions(context.Background(), c.token, brokerapi.PeerQuery{User: "u1"})
		if status(err) != c.want {
			t.Errorf("peer question about u1 with %s: %+v, %v; want %d", c.what, got, err, c.want)
		}
	}
	// The same question with a true peer token is answered: what the
	// refusals keep from everyone else.
	tok, err := r.tokens.MintPeer("u1", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A true peer token asks about no host it does not name.
	if got, err := r.client.PeerSessions(context.Background(), tok, brokerapi.PeerQuery{User: "u1", Hosts: []string{"h1"}}); status(err) != http.StatusForbidden {
		t.Errorf("peer question about u1 and h1 with a token naming no host: %+v, %v; want 403", got, err)
	}
	got, err := r.client.PeerSessions(context.Background(), tok, brokerapi.PeerQuery{User: "u1"})
	if err != nil || len(got.Sessions) != 1 || got.Sessions[0].ID != res.SessionID || got.Sessions[0].Host != "h1" {
		t.Fatalf("peer question about u1 with a peer token: %+v, %v; want session %s on h1", got, err, res.SessionID)
	}
}

// TestOutageLaunchWithAPeerThatDoesNotAnswer: a peer that takes the
// connection and never answers (and one that refuses it) hold a launch
// in an outage no longer than broker.peer_timeout; the launch is placed
// from the copy, the silence counted, and logged once per peer, not at
// every launch.
func TestOutageLaunchWithAPeerThatDoesNotAnswer(t *testing.T) {
	pg := testkit.StartPostgres(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	const peerTimeout = time.Second
	r := newRig(t, pg.NewDB(t), func(c *config.Config) {
		c.Broker.Peers = []string{"https://" + silent.Addr().String(), "https://" + closed.Addr().String()}
		c.Broker.PeerTimeout = config.Duration(peerTimeout)
		c.Broker.LaunchTimeout = config.Duration(10 * time.Second)
	})
	r.agent("h1", "desk", "")
	if err := pg.Kill(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"u1", "u2", "u3"} {
		start := time.Now()
		res, err := r.launch(brokerclient.Bearer("frontend-token"), brokerapi.LaunchRequest{DeliveryGroup: "desk", User: u, Groups: []string{"bench"}})
		took := time.Since(start)
		if err != nil || res.Host != "h1" || res.Reconnect {
			t.Fatalf("launch for %s with the database down and no peer answering: %+v, %v", u, res, err)
		}
		// The first launch also pings the database once before it
		// places from the copy.
		if took > peerTimeout+2*time.Second {
			t.Errorf("launch for %s took %s with broker.peer_timeout %s", u, took.Round(time.Millisecond), peerTimeout)
		}
	}
	if got := testutil.ToFloat64(mustCounter(t, r.reg, "deskway_broker_peer_questions_total", "result", "unreachable")); got != 6 {
		t.Errorf("peer questions counted unreachable: %v, want 6 (3 launches × 2 peers)", got)
	}
	logs := r.logs.String()
	for _, p := range []string{silent.Addr().String(), closed.Addr().String()} {
		if n := strings.Count(logs, `"peer":"https://`+p+`"`); n != 1 {
			t.Errorf("peer %s is logged %d times, want once:\n%s", p, n, logs)
		}
	}
}

// peerBrokers starts brokers A and B on one database, each listing the
// other in broker.peers, with hosts h1 and h2 registered at A and B
// holding their credentials too.
func peerBrokers(t *testing.T, dsn string) (a, b *world) {
	t.Helper()
	return peerBrokersOn(t, dsn, dsn)
}

// peerBrokersOn is peerBrokers with each broker reaching the database
// through a DSN of its own.
func peerBrokersOn(t *testing.T, dsnA, dsnB string) (a, b *world) {
	t.Helper()
	la, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Every httptest TLS server has the same certificate.
	probe := httptest.NewTLSServer(http.NotFoundHandler())
	tc := probe.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	probe.Close()
	a = newWorldOn(t, "broker A", dsnA, []string{"h1", "h2"}, rigNet{ln: la, peerTLS: tc}, []string{"https://" + lb.Addr().String()})
	b = newWorldOn(t, "broker B", dsnB, nil, rigNet{ln: lb, peerTLS: tc}, []string{"https://" + la.Addr().String()})
	for h, cred := range a.creds {
		b.creds[h] = cred
	}
	return a, b
}
