package broker_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/obs"
	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tlsconf"
)

// withLab adds a second delivery group, lab, that desk users are not in.
func withLab(c *config.Config) {
	c.Broker.DeliveryGroups = append(c.Broker.DeliveryGroups, config.DeliveryGrp{Name: "lab", Groups: []string{"contractors"}})
}

func (r *rig) register(token string, req brokerapi.RegisterRequest) (*brokerapi.RegisterResponse, error) {
	if req.Port == 0 {
		req.Port = 3389
	}
	return r.client.Register(context.Background(), token, req)
}

// TestJoinTokenCannotTakeOverAHost: a join token registers new hosts in
// its own group only; re-registering a name needs that host's own
// credential, so no token can move a host or redirect its users.
func TestJoinTokenCannotTakeOverAHost(t *testing.T) {
	r := newRig(t, "", withLab)
	cred := r.agent("desk-01", "desk", "")
	alice := brokerclient.Basic("alice", "Alice-Pass-1")
	first, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil || first.Address != "desk-01.lan" {
		t.Fatalf("launch: %+v %v", first, err)
	}
	labJoin, _ := r.tokens.MintJoin("lab", "", time.Hour, 0)
	deskJoin, _ := r.tokens.MintJoin("desk", "", time.Hour, 0)
	for name, tok := range map[string]string{"lab join token": labJoin, "desk join token": deskJoin} {
		_, err := r.register(tok, brokerapi.RegisterRequest{Name: "desk-01", Address: "attacker.example.test"})
		if status(err) != http.StatusConflict || !strings.Contains(err.Error(), "already registered") {
			t.Fatalf("%s re-registering desk-01: %v, want 409 already registered", name, err)
		}
	}
	hosts, err := r.store.Hosts(context.Background(), "")
	if err != nil || len(hosts) != 1 || hosts[0].Group != "desk" || hosts[0].Address != "desk-01.lan" {
		t.Fatalf("hosts after the attempts: %+v %v", hosts, err)
	}
	again, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil || !again.Reconnect || again.Address != "desk-01.lan" {
		t.Fatalf("alice's reconnect went to %+v (%v)", again, err)
	}
	// The host's own credential may update it, and only it.
	if _, err := r.register(cred, brokerapi.RegisterRequest{Name: "desk-01", Address: "desk-01b.lan"}); err != nil {
		t.Fatalf("desk-01 re-registering with its credential: %v", err)
	}
	if _, err := r.register(cred, brokerapi.RegisterRequest{Name: "desk-02", Address: "x.lan"}); status(err) != http.StatusForbidden {
		t.Fatalf("desk-01's credential registering desk-02: %v, want 403", err)
	}
	// An administrator frees a name (a host with live sessions stays).
	del := func(name string) int {
		rec := httptest.NewRecorder()
		r.admin.ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, "/api/v1/broker/hosts/"+name, nil))
		return rec.Code
	}
	if code := del("desk-01"); code != http.StatusConflict {
		t.Fatalf("removing a host with a live session: %d", code)
	}
	r.agent("spare-01", "desk", "")
	if code := del("spare-01"); code != http.StatusNoContent {
		t.Fatalf("removing a host: %d", code)
	}
	if _, err := r.register(labJoin, brokerapi.RegisterRequest{Name: "spare-01", Address: "spare.lan"}); err != nil {
		t.Fatalf("joining a removed host's name: %v", err)
	}
}

// TestJoinTokenUsesHoldAcrossBrokers: a token for three hosts registers
// three, however many brokers sharing PostgreSQL are asked at once.
func TestJoinTokenUsesHoldAcrossBrokers(t *testing.T) {
	pg := testkit.StartPostgres(t)
	dsn := pg.NewDB(t)
	a, b := newRig(t, dsn, nil), newRig(t, dsn, nil)
	tok, _ := a.tokens.MintJoin("desk", "", time.Hour, 3)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, used := 0, 0
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := a
			if i%2 == 1 {
				r = b
			}
			_, err := r.register(tok, brokerapi.RegisterRequest{Name: fmt.Sprintf("h%d", i), Address: fmt.Sprintf("h%d.lan", i)})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case status(err) == http.StatusUnauthorized && strings.Contains(err.Error(), "registered the 3 hosts it may"):
				used++
			default:
				t.Errorf("registration %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if ok != 3 || used != 9 {
		t.Fatalf("%d registrations succeeded and %d were told the token is used up; want 3 and 9", ok, used)
	}
}

// serving runs r's broker behind its real HTTPS server (timeouts and
// guards included) and, beside it, the admin listener with the broker's
// admin API; it returns both addresses.
func (r *rig) serving(t *testing.T) (brokerAddr, adminAddr string) {
	t.Helper()
	_, _, cert, key := testkit.TLS(t)
	tc, err := tlsconf.Load(cert, key, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	t.Cleanup(func() { cancel(); <-done; <-done })
	for _, serve := range []func(net.Listener) error{
		func(ln net.Listener) error { return r.b.Serve(ctx, ln, tc) },
		func(ln net.Listener) error {
			a := &obs.Admin{Log: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Tokens: []string{"admin-tok"},
				API: []*http.ServeMux{r.b.AdminHandler()}, Throttle: auth.NewThrottle(5, 20, 5*time.Minute, nil)}
			return a.Serve(ctx, ln, tc)
		},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if brokerAddr == "" {
			brokerAddr = ln.Addr().String()
		} else {
			adminAddr = ln.Addr().String()
		}
		go func() { _ = serve(ln); done <- struct{}{} }()
	}
	return brokerAddr, adminAddr
}

// raw sends head (a request line and headers) and then body, one byte
// every gap, on a new TLS connection, and returns the status line the
// server answers with, or why there was none.
func raw(t *testing.T, addr, head, body string, gap, wait time.Duration) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(wait))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			got <- "no answer: " + err.Error()
			return
		}
		got <- strings.TrimSpace(line)
	}()
	for i := 0; i < len(body); i++ {
		select {
		case s := <-got:
			return s
		case <-time.After(gap):
		}
		if _, err := io.WriteString(conn, body[i:i+1]); err != nil {
			break
		}
	}
	return <-got
}

// TestBrokerHTTPGuards: bodies are read only after the credential is
// checked, a request may take read_timeout at most, and a browser on
// another site cannot make a state change with the user's credentials.
func TestBrokerHTTPGuards(t *testing.T) {
	r := newRig(t, "", func(c *config.Config) { c.Broker.ReadTimeout = config.Duration(2 * time.Second) })
	r.agent("h1", "desk", "")
	addr, adminAddr := r.serving(t)
	basic := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("alice:Alice-Pass-1")) + "\r\n"

	t.Run("no credential, no body read", func(t *testing.T) {
		for _, path := range []string{"/api/v1/agent/heartbeat", "/api/v1/agent/events", "/api/v1/agent/register", "/api/v1/launch"} {
			head := "POST " + path + " HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\nAuthorization: Bearer forged\r\n\r\n"
			if got := raw(t, addr, head, "", 0, time.Second); !strings.Contains(got, " 401 ") {
				t.Fatalf("%s with a forged credential and a body still to come: %q, want 401 at once", path, got)
			}
		}
	})
	t.Run("slow body", func(t *testing.T) {
		body := `{"delivery_group":"desk","user":""}` + strings.Repeat(" ", 40)
		head := fmt.Sprintf("POST /api/v1/launch HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n", len(body), basic)
		start := time.Now()
		got := raw(t, addr, head, body, 150*time.Millisecond, 10*time.Second)
		if d := time.Since(start); d > 4*time.Second || strings.Contains(got, " 200 ") {
			t.Fatalf("a body trickled for %s was still read (%q); read_timeout is 2s", d, got)
		}
	})
	t.Run("cross-site launches", func(t *testing.T) {
		launch := `{"delivery_group":"desk"}`
		for _, c := range []struct{ name, headers, want string }{
			{"text/plain body", "Content-Type: text/plain\r\n", " 415 "},
			{"form body", "Content-Type: application/x-www-form-urlencoded\r\n", " 415 "},
			{"foreign Origin", "Content-Type: application/json\r\nOrigin: https://evil.example.test\r\n", " 403 "},
			{"cross-site fetch", "Content-Type: application/json\r\nSec-Fetch-Site: cross-site\r\n", " 403 "},
			{"same origin", "Content-Type: application/json\r\nOrigin: https://b\r\n", " 200 "},
		} {
			head := fmt.Sprintf("POST /api/v1/launch HTTP/1.1\r\nHost: b\r\n%sContent-Length: %d\r\n%s\r\n%s", c.headers, len(launch), basic, launch)
			if got := raw(t, addr, head, "", 0, 5*time.Second); !strings.Contains(got, c.want) {
				t.Fatalf("%s: %q, want%s", c.name, got, c.want)
			}
		}
		live, _ := r.store.Sessions(context.Background(), "alice", false, 10)
		if len(live) != 1 {
			t.Fatalf("alice has %d sessions after one allowed launch", len(live))
		}
	})
	t.Run("admin API", func(t *testing.T) {
		drain := `{"drain":true}`
		head := fmt.Sprintf("POST /api/v1/broker/hosts/h1/drain HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer admin-tok\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(drain), drain)
		if got := raw(t, adminAddr, head, "", 0, 5*time.Second); !strings.Contains(got, " 415 ") {
			t.Fatalf("admin drain with a text/plain body: %q", got)
		}
		head = "POST /api/v1/broker/hosts/h1/drain HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 5000000\r\n\r\n"
		if got := raw(t, adminAddr, head, "", 0, time.Second); !strings.Contains(got, " 401 ") {
			t.Fatalf("admin call without a token and a body to come: %q", got)
		}
	})
}

// TestHostCannotPinUsers: a host that reports a session for a user the
// broker never placed there does not draw that user's launches (here a
// draining host at 90 % CPU), unless the group trusts its hosts; the
// claimed session still takes the host's slot.
func TestHostCannotPinUsers(t *testing.T) {
	for _, trust := range []bool{false, true} {
		t.Run(fmt.Sprintf("trust_host_sessions=%v", trust), func(t *testing.T) {
			r := newRig(t, "", func(c *config.Config) { c.Broker.DeliveryGroups[0].TrustHostSessions = trust })
			rogue := r.agent("rogue-1", "desk", "")
			r.agent("good-1", "desk", "")
			r.beat("rogue-1", rogue, brokerapi.Heartbeat{DiskIdle: 0.9, CPU: 0.9, Drain: true,
				Sessions: []brokerapi.Session{{User: "alice", State: "disconnected"}}})
			hosts, _ := r.store.Hosts(context.Background(), "desk")
			for _, h := range hosts {
				if h.Name == "rogue-1" && h.Sessions != 1 {
					t.Fatalf("the reported session takes no slot: %+v", h)
				}
			}
			res, err := r.launch(brokerclient.Basic("alice", "Alice-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
			if err != nil {
				t.Fatal(err)
			}
			if trust != (res.Host == "rogue-1") || trust != res.Reconnect {
				t.Fatalf("alice's launch went to %s (reconnect %v) with trust_host_sessions=%v", res.Host, res.Reconnect, trust)
			}
		})
	}
}

// TestBrokerThrottleKeysDoNotMix: failures under a user name that looks
// like an address are that user's, never the address's.
func TestBrokerThrottleKeysDoNotMix(t *testing.T) {
	r := newRig(t, "", nil)
	r.agent("h1", "desk", "")
	for range 6 {
		_, err := r.launch(brokerclient.Basic("127.0.0.1", "guess"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
		if s := status(err); s != http.StatusUnauthorized && s != http.StatusTooManyRequests {
			t.Fatal(err)
		}
	}
	if _, err := r.launch(brokerclient.Basic("alice", "Alice-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"}); err != nil {
		t.Fatalf("alice from 127.0.0.1 after failures of a user named 127.0.0.1: %v", err)
	}
	// A locked user gets 429 with Retry-After and the reason.
	for range 5 {
		_, _ = r.launch(brokerclient.Basic("bob", "guess"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	}
	_, err := r.launch(brokerclient.Basic("bob", "Bob-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if status(err) != http.StatusTooManyRequests || !strings.Contains(err.Error(), "failed logins as bob") {
		t.Fatalf("bob after 5 failures: %v", err)
	}
}

// TestBearerGuessesAreThrottled: front-end and admin tokens are strings an
// operator chose, so guessing them from one address is counted and
// stopped as password guessing is: past the per-address limit the address
// gets 429 with Retry-After before its token is even compared.
func TestBearerGuessesAreThrottled(t *testing.T) {
	r := newRig(t, "", nil)
	brokerAddr, adminAddr := r.serving(t)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, c := range []struct{ name, method, url, good string }{
		{"front-end token", "POST", "https://" + brokerAddr + "/api/v1/launch", "frontend-token"},
		{"admin token", "GET", "https://" + adminAddr + "/api/v1/broker/hosts", "admin-tok"},
	} {
		t.Run(c.name, func(t *testing.T) {
			do := func(token string) *http.Response {
				t.Helper()
				req, _ := http.NewRequest(c.method, c.url, strings.NewReader(`{"delivery_group":"desk","user":"alice"}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp
			}
			for i := range 20 { // the per-address limit
				if resp := do(fmt.Sprintf("guess-%d", i)); resp.StatusCode != http.StatusUnauthorized {
					t.Fatalf("guess %d: %s, want 401", i, resp.Status)
				}
			}
			for _, tok := range []string{"guess-21", c.good} {
				resp := do(tok)
				if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
					t.Fatalf("after 20 wrong tokens from one address, %q: %s (Retry-After %q), want 429 with Retry-After",
						tok, resp.Status, resp.Header.Get("Retry-After"))
				}
			}
		})
	}
}

// TestRemovedHostCredentialCannotTakeOverItsReplacement: once an
// administrator removes a host, its agent's credential (still within its
// week) must not reach the host that joins under the same name later:
// re-registering it would send its users to the old agent's address, and
// heartbeats or events would drain it or invent sessions.
func TestRemovedHostCredentialCannotTakeOverItsReplacement(t *testing.T) {
	r := newRig(t, "", withLab)
	ctx := context.Background()
	old := r.agent("hostA", "desk", "")
	remove := func(name string) {
		t.Helper()
		rec := httptest.NewRecorder()
		r.admin.ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, "/api/v1/broker/hosts/"+name, nil))
		if rec.Code != http.StatusNoContent {
			t.Fatalf("removing %s: %d %s", name, rec.Code, rec.Body)
		}
	}
	// A session only the agent reports (the broker never placed bob
	// there) does not keep the host from being removed.
	r.beat("hostA", old, brokerapi.Heartbeat{DiskIdle: 0.9, Sessions: []brokerapi.Session{{User: "bob", State: "active"}}})
	remove("hostA")
	fresh := r.agent("hostA", "desk", "") // a new machine joins under the name
	if _, err := r.register(old, brokerapi.RegisterRequest{Name: "hostA", Address: "attacker.example.test"}); status(err) != http.StatusNotFound {
		t.Fatalf("the removed host's credential re-registered the new hostA: %v, want 404", err)
	}
	_, err := r.client.Heartbeat(ctx, old, brokerapi.Heartbeat{Host: "hostA", DiskIdle: 0.9, Drain: true,
		Sessions: []brokerapi.Session{{User: "bob", State: "active"}}})
	if status(err) != http.StatusNotFound {
		t.Fatalf("the removed host's credential sent a heartbeat for the new hostA: %v, want 404", err)
	}
	if err := r.client.Events(ctx, old, brokerapi.Events{Host: "hostA", Events: []brokerapi.Event{{User: "bob", State: "active"}}}); status(err) != http.StatusNotFound {
		t.Fatalf("the removed host's credential sent events for the new hostA: %v, want 404", err)
	}
	res, err := r.launch(brokerclient.Basic("alice", "Alice-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil || res.Host != "hostA" || res.Address != "hostA.lan" {
		t.Fatalf("alice's launch: %+v %v, want hostA at hostA.lan", res, err)
	}
	hosts, err := r.store.Hosts(ctx, "")
	if err != nil || len(hosts) != 1 || hosts[0].AgentDrain || hosts[0].Sessions != 1 {
		t.Fatalf("the new hostA after the old credential's attempts: %+v %v", hosts, err)
	}
	// The new machine's own credential works; so does the old one's
	// across groups no more: hostA joined again in lab is not desk's.
	r.beat("hostA", fresh, brokerapi.Heartbeat{DiskIdle: 0.9, Sessions: []brokerapi.Session{{User: "alice", State: "active"}}})
	labOld := r.agent("hostC", "lab", "")
	remove("hostC")
	r.agent("hostC", "lab", "")
	if _, err := r.client.Heartbeat(ctx, labOld, brokerapi.Heartbeat{Host: "hostC", Drain: true}); status(err) != http.StatusNotFound {
		t.Fatalf("a removed lab host's credential reached the lab host that replaced it: %v", err)
	}
}
