package broker_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/bench/latency"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

const key = "broker-test-token-key-0123456789abcdef"

type rig struct {
	t      *testing.T
	srv    *httptest.Server
	client *brokerclient.Client
	tokens *auth.Tokens
	store  *store.Store
	reg    *prometheus.Registry
	logs   *testkit.Buffer
	admin  http.Handler
	b      *broker.Server
}

func newRig(t *testing.T, dsn string, mutate func(*config.Config)) *rig {
	t.Helper()
	return newRigOn(t, dsn, rigNet{}, mutate)
}

// rigNet is where a rig's broker listens and how it checks its peers,
// for brokers that must know each other's addresses before they start,
// and the clock it reads; the zero value is a listener of httptest's
// own, no peers and time.Now.
type rigNet struct {
	ln      net.Listener
	peerTLS *tls.Config
	now     func() time.Time
}

func newRigOn(t *testing.T, dsn string, rn rigNet, mutate func(*config.Config)) *rig {
	t.Helper()
	if dsn == "" {
		dsn = filepath.Join(t.TempDir(), "broker.db")
	}
	cfg := &config.Config{
		StateDir: t.TempDir(),
		Auth: config.Auth{TokenKey: config.NewSecret(key), Users: []config.User{
			{Name: "alice", Password: config.NewSecret("Alice-Pass-1"), Groups: []string{"staff"}},
			{Name: "bob", Password: config.NewSecret("Bob-Pass-1"), Groups: []string{"contractors"}},
			{Name: "erin", Password: config.NewSecret("Erin-Pass-1"), Groups: []string{"staff"}, Zone: "eu"},
		}},
		Broker: &config.Broker{
			Database:       config.NewDatabaseURL(dsn),
			Gateway:        "gw.example.test:443",
			FrontendTokens: []config.Secret{config.NewSecret("frontend-token")},
			DeliveryGroups: []config.DeliveryGrp{
				{Name: "desk", Groups: []string{"staff", "bench"}, LogonLimit: 5},
				{Name: "mine", Kind: "personal", Users: []string{"alice"}},
			},
		},
	}
	if mutate != nil {
		mutate(cfg)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), cfg.Broker.Database.Value(), cfg.Broker.MaxDBConnections)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	users, err := auth.NewUsers(cfg.Auth.Users)
	if err != nil {
		t.Fatal(err)
	}
	users.WithDesktops(cfg.Auth.DesktopAccounts)
	tokens, err := auth.NewTokens([]byte(key), nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.Buffer{}
	reg := prometheus.NewRegistry()
	b, err := broker.New(cfg.Broker, broker.Deps{Logger: slog.New(slog.NewJSONHandler(logs, nil)), Registry: reg,
		Users: users, Tokens: tokens, Store: st, StateDir: cfg.StateDir, PeerTLS: rn.peerTLS, Now: rn.now})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(b.Handler())
	if rn.ln != nil {
		srv.Listener.Close()
		srv.Listener = rn.ln
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &rig{t: t, srv: srv, tokens: tokens, store: st, reg: reg, logs: logs, admin: b.AdminHandler(), b: b,
		client: &brokerclient.Client{Base: srv.URL, HTTP: srv.Client(), MaxRetries: 50}}
}

// agent registers a host and returns its credential.
func (r *rig) agent(name, group, zone string) string {
	r.t.Helper()
	join, err := r.tokens.MintJoin(group, zone, time.Hour, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	res, err := r.client.Register(context.Background(), join, brokerapi.RegisterRequest{Name: name, Address: name + ".lan", Port: 3389})
	if err != nil {
		r.t.Fatal(err)
	}
	r.beat(name, res.Credential, brokerapi.Heartbeat{DiskIdle: 0.9})
	return res.Credential
}

func (r *rig) beat(host, cred string, hb brokerapi.Heartbeat) {
	r.t.Helper()
	hb.Host = host
	if _, err := r.client.Heartbeat(context.Background(), cred, hb); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) launch(cred brokerclient.Credentials, req brokerapi.LaunchRequest) (*brokerapi.LaunchResponse, error) {
	res, _, err := r.client.Launch(context.Background(), cred, req)
	return res, err
}

func status(err error) int {
	var se *brokerclient.StatusError
	if errors.As(err, &se) {
		return se.Status
	}
	return 0
}

func TestLaunchReturnsRDPFileWithGatewayToken(t *testing.T) {
	r := newRig(t, "", nil)
	r.agent("h1", "desk", "")
	res, err := r.launch(brokerclient.Basic("alice", "Alice-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Host != "h1" || res.Address != "h1.lan" || res.Port != 3389 || res.Reconnect || res.Gateway != "gw.example.test:443" {
		t.Fatalf("launch = %+v", res)
	}
	claims, err := r.tokens.Verify(res.Token)
	if err != nil {
		t.Fatal(err)
	}
	if claims.User() != "alice" || claims.Host != "h1.lan" || claims.Port != 3389 || claims.ID == "" {
		t.Fatalf("token claims = %+v", claims)
	}
	for _, line := range []string{"full address:s:h1.lan:3389\r\n", "gatewayhostname:s:gw.example.test:443\r\n",
		"gatewayaccesstoken:s:" + res.Token + "\r\n", "gatewaycredentialssource:i:5\r\n", "username:s:alice\r\n",
		"autoreconnection enabled:i:1\r\n"} {
		if !strings.Contains(res.RDP, line) {
			t.Fatalf(".rdp file lacks %q:\n%s", line, res.RDP)
		}
	}
	again, err := r.launch(brokerclient.Basic("alice", "Alice-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil || !again.Reconnect || again.SessionID != res.SessionID {
		t.Fatalf("relaunch = %+v, %v; want a reconnect to %s", again, err, res.SessionID)
	}
	// The same launch as an .rdp download.
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/api/v1/launch", strings.NewReader(`{"delivery_group":"desk"}`))
	req.SetBasicAuth("alice", "Alice-Pass-1")
	req.Header.Set("Accept", "application/x-rdp")
	resp, err := r.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != "application/x-rdp" || !strings.HasPrefix(string(body), "full address:s:h1.lan:3389\r\n") {
		t.Fatalf("rdp download: %s %q", resp.Header.Get("Content-Type"), body)
	}
	if got := testutil.ToFloat64(mustCounter(t, r.reg, "deskway_broker_launches_total", "result", "reconnected")); got != 2 {
		t.Fatalf("reconnected launches metric = %v, want 2", got)
	}
}

func mustCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x", Help: "x"}, func() float64 { return m.GetCounter().GetValue() })
				}
			}
		}
	}
	t.Fatalf("no metric %s{%s=%q}", name, label, value)
	return nil
}

// gaugeValue is the value of the unlabelled gauge name in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

func TestFrontEndLaunchesOnBehalfAndZones(t *testing.T) {
	r := newRig(t, "", func(c *config.Config) { c.Broker.Zone = "us" })
	r.agent("eu-1", "desk", "eu")
	r.agent("us-1", "desk", "us")
	fe := brokerclient.Bearer("frontend-token")
	// A user the broker does not know, asserted by the front end with a group.
	res, err := r.launch(fe, brokerapi.LaunchRequest{DeliveryGroup: "desk", User: "u1", Groups: []string{"bench"}})
	if err != nil || res.Host != "us-1" {
		t.Fatalf("front-end launch with no zone = %+v %v, want the broker's zone us", res, err)
	}
	res, err = r.launch(fe, brokerapi.LaunchRequest{DeliveryGroup: "desk", User: "u2", Groups: []string{"bench"}, Zone: "eu"})
	if err != nil || res.Host != "eu-1" {
		t.Fatalf("launch from zone eu = %+v %v", res, err)
	}
	// erin's home zone wins over the broker's.
	res, err = r.launch(brokerclient.Basic("erin", "Erin-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil || res.Host != "eu-1" {
		t.Fatalf("launch for a user homed in eu = %+v %v", res, err)
	}
	// A local user's groups come from the broker, not the front end.
	if _, err := r.launch(fe, brokerapi.LaunchRequest{DeliveryGroup: "desk", User: "bob", Groups: []string{"staff"}}); status(err) != http.StatusForbidden {
		t.Fatalf("front end claiming staff for bob: %v, want 403", err)
	}
}

func TestNoHostSaysWhy(t *testing.T) {
	r := newRig(t, "", func(c *config.Config) { c.Broker.DeliveryGroups[0].SessionLimit = 1 })
	fe := brokerclient.Bearer("frontend-token")
	launch := func(user string) error {
		_, err := r.launch(fe, brokerapi.LaunchRequest{DeliveryGroup: "desk", User: user, Groups: []string{"bench"}})
		return err
	}
	if err := launch("nobody"); status(err) != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "has no hosts: run deskway agent") {
		t.Fatalf("launch on an empty group: %v", err)
	}
	r.agent("full-1", "desk", "")
	if err := launch("first"); err != nil { // the only host: now full
		t.Fatal(err)
	}
	sick := r.agent("sick-1", "desk", "")
	r.agent("drain-1", "desk", "")
	r.agent("drain-2", "desk", "")
	r.beat("sick-1", sick, brokerapi.Heartbeat{DiskIdle: 0.9, DiskLatencyMS: 41})
	for _, h := range []string{"drain-1", "drain-2"} {
		req := httptest.NewRequest(http.MethodPost, "/api/v1/broker/hosts/"+h+"/drain", strings.NewReader(`{"drain":true}`))
		rec := httptest.NewRecorder()
		r.admin.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("drain %s: %d %s", h, rec.Code, rec.Body)
		}
	}
	err := launch("second")
	want := `no host of delivery group "desk" can take a launch: 2 draining, 1 full, 1 unhealthy (sick-1: disk latency 41 ms > 25 ms)`
	if status(err) != http.StatusServiceUnavailable || !strings.Contains(err.Error(), want) {
		t.Fatalf("launch with no eligible host: %v\nwant %q", err, want)
	}
}

func TestThrottleAnswers503AndClientsRetry(t *testing.T) {
	// PostgreSQL 40 ms away makes every launch last a while, so 40
	// launches at once overlap and a cap of 4 must turn most away.
	pg := testkit.StartPostgres(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	proxy := &latency.Proxy{Target: pg.Addr(), OneWay: 20 * time.Millisecond}
	go func() { _ = proxy.Serve(ctx, ln) }()
	dsn := strings.Replace(pg.NewDB(t), pg.Addr(), ln.Addr().String(), 1)
	r := newRig(t, dsn, func(c *config.Config) {
		c.Broker.MaxConcurrentLaunches = 4
		c.Broker.DeliveryGroups[0].LogonLimit = 100
	})
	for i := range 4 {
		r.agent(fmt.Sprint("h", i), "desk", "")
	}
	local := r.b.Local(50)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	retries := make(chan int, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := brokerapi.LaunchRequest{DeliveryGroup: "desk", User: fmt.Sprint("user", i), Groups: []string{"bench"}}
			if i%2 == 0 {
				_, n, err := r.client.Launch(context.Background(), brokerclient.Bearer("frontend-token"), req)
				errs <- err
				retries <- n
				return
			}
			// Half from a portal in the broker's process, which must
			// retry as a client over HTTPS does: most of its first tries
			// are turned away too.
			_, err := local.Launch(context.Background(), req)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	close(retries)
	for err := range errs {
		if err != nil {
			t.Fatalf("a launch failed despite retries: %v", err)
		}
	}
	total := 0
	for n := range retries {
		total += n
	}
	throttled := testutil.ToFloat64(mustCounter(t, r.reg, "deskway_broker_launches_total", "result", "throttled"))
	if total == 0 || throttled <= float64(total) {
		t.Fatalf("%v launches throttled, clients over HTTPS retried %d times: want some, and one retry per 503, with the in-process ones' besides", throttled, total)
	}
	live, _ := r.store.Sessions(context.Background(), "", false, 100)
	if len(live) != 40 {
		t.Fatalf("%d sessions after 40 launches", len(live))
	}
}

// TestRDPFileHostUsername: a group whose hosts do not share the broker's
// accounts (host_username: none, as deskway up's demo) gets an .rdp file
// with no user name, so the client asks for or is given the host's own;
// naming the broker's user there would log on as the wrong account.
func TestRDPFileHostUsername(t *testing.T) {
	r := newRig(t, "", func(c *config.Config) {
		c.Broker.DeliveryGroups = append(c.Broker.DeliveryGroups, config.DeliveryGrp{Name: "xrdp", Groups: []string{"staff"}, HostUsername: "none"})
	})
	r.agent("h1", "desk", "")
	r.agent("x1", "xrdp", "")
	alice := brokerclient.Basic("alice", "Alice-Pass-1")
	for group, want := range map[string]bool{"desk": true, "xrdp": false} {
		res, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: group})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(res.RDP, "username:s:"); got != want {
			t.Errorf("group %s: .rdp names a user: %v, want %v:\n%s", group, got, want, res.RDP)
		}
	}
}

// TestReloadChangesEntitlements: a reload's delivery groups decide the
// next launch (a new group is written into the database and launches
// into it are placed; a group a user lost refuses them), and its users
// sign in.
func TestReloadChangesEntitlements(t *testing.T) {
	var cfg *config.Config
	r := newRig(t, "", func(c *config.Config) { cfg = c })
	r.agent("h1", "desk", "")
	alice := brokerclient.Basic("alice", "Alice-Pass-1")
	if _, err := r.launch(alice, brokerapi.LaunchRequest{DeliveryGroup: "desk"}); err != nil {
		t.Fatal(err)
	}
	next := *cfg.Broker
	next.DeliveryGroups = []config.DeliveryGrp{
		{Name: "desk", Groups: []string{"bench"}, LogonLimit: 5}, // staff no longer
		{Name: "lab", Groups: []string{"staff"}, LogonLimit: 5},
	}
	whole := *cfg
	whole.Broker = &next
	whole.ApplyDefaults() // as config.Load does
	if err := whole.Validate(); err != nil {
		t.Fatal(err)
	}
	users, err := auth.NewUsers(append(cfg.Auth.Users, config.User{Name: "zoe", Password: config.NewSecret("Zoe-Pass-1"), Groups: []string{"staff"}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.b.Reload(context.Background(), &next, users); err != nil {
		t.Fatal(err)
	}
	if _, err := r.launch(brokerclient.Basic("erin", "Erin-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "desk"}); status(err) != http.StatusForbidden {
		t.Fatalf("erin (staff) in desk after staff lost it: %v, want 403", err)
	}
	r.agent("l1", "lab", "")
	res, err := r.launch(brokerclient.Basic("zoe", "Zoe-Pass-1"), brokerapi.LaunchRequest{DeliveryGroup: "lab"})
	if err != nil || res.Host != "l1" {
		t.Fatalf("zoe, added by the reload, in the new group lab: %+v %v", res, err)
	}
}

// maintain runs b's maintenance loop under ctx until the test ends, then
// stops it and waits for it: the loop writes the host cache's snapshot
// into the state directory, and a write after the test's directories are
// being removed failed their cleanup ("directory not empty").
func maintain(t *testing.T, ctx context.Context, b *broker.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Maintain(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}
