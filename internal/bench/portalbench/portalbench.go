// Package portalbench measures the web portal and the admin console: the
// same users launch through the portal (sign in, their desktops page,
// Launch) and through the broker's bare launch API, taking turns in one
// run against one broker; then the console's pages are timed on a second
// broker whose store holds 10,000 live sessions.
package portalbench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/obs"
	"github.com/deskway/deskway/internal/tlsconf"
	"github.com/deskway/deskway/internal/web"
)

// Options configure a run.
type Options struct {
	// Users launch once each per run and system.
	Users       int
	Concurrency int
	Runs        int
	// Sessions in the store when the console is timed: a second broker
	// with a fresh database, filled through the API.
	Sessions int
	// ConsoleRequests are timed per console page.
	ConsoleRequests int
	Hosts           int
	Out, Command    string
	Log             *slog.Logger
}

func (o *Options) defaults() {
	if o.Sessions == 0 {
		o.Sessions = 10000
	}
	if o.Concurrency == 0 {
		o.Concurrency = 16
	}
	if o.Runs == 0 {
		o.Runs = 5
	}
	if o.Users == 0 {
		// Storms of a second or two each: a checkpoint of SQLite's
		// write-ahead log, or a stall of this shared machine, then
		// falls on one storm as a small share of it.
		o.Users = 5000
	}
	if o.ConsoleRequests == 0 {
		o.ConsoleRequests = 300
	}
	if o.Hosts == 0 {
		o.Hosts = 20
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

const (
	tokenKey      = "portalbench-token-key-0123456789abcdef"
	frontendToken = "portalbench-frontend"
	adminToken    = "portalbench-admin"
	consoleToken  = "portalbench-console"
	password      = "Bench-Pass-1"
)

// rig is one broker (SQLite, embedded as by default), its admin API, and
// the portal with its console, all over TLS on loopback.
type rig struct {
	broker, admin, portal string
	client                *http.Client // trusts the rig's certificate
	noRedirect            *http.Client // the same, for the storms: no timeout, no redirects
	st                    *store.Store
	creds                 []string // hosts' credentials
}

// start starts a rig in dir whose broker knows n users.
func (o *Options) start(ctx context.Context, wg *sync.WaitGroup, dir string, n int) (*rig, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := tlsconf.SelfSigned(certFile, keyFile, nil); err != nil {
		return nil, err
	}
	users := make([]config.User, 0, n+1)
	for i := range n {
		users = append(users, config.User{Name: fmt.Sprintf("user%05d", i), Password: config.NewSecret(password), Groups: []string{"staff"}})
	}
	users = append(users, config.User{Name: "ops", Password: config.NewSecret(password), Groups: []string{"admins"}})
	cfg := &config.Config{StateDir: dir, Admin: config.Admin{Listen: "127.0.0.1:0", Tokens: []config.Secret{config.NewSecret(adminToken)},
		ConsoleTokens: []config.Secret{config.NewSecret(consoleToken)}},
		Auth: config.Auth{TokenKey: config.NewSecret(tokenKey), Users: users,
			// Thousands of sign-ins from one address are the bench, not an attack.
			MaxFailures: 1000, MaxFailuresPerAddress: 1 << 20},
		Broker: &config.Broker{Database: config.NewDatabaseURL(filepath.Join(dir, "broker.db")), Gateway: "gateway.bench:443",
			FrontendTokens: []config.Secret{config.NewSecret(frontendToken)},
			DeliveryGroups: []config.DeliveryGrp{{Name: "desk", Groups: []string{"staff"}, SessionLimit: 100000, LogonLimit: 100000}}},
		Web: &config.Web{Console: &config.Console{Admins: []string{"admins"}}},
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	st, err := store.Open(ctx, cfg.Broker.Database.Value(), cfg.Broker.MaxDBConnections)
	if err != nil {
		return nil, err
	}
	us, err := auth.NewUsers(cfg.Auth.Users)
	if err != nil {
		st.Close()
		return nil, err
	}
	tokens, _ := auth.NewTokens([]byte(tokenKey), nil)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := broker.New(cfg.Broker, broker.Deps{Logger: quiet, Registry: prometheus.NewRegistry(), Users: us, Tokens: tokens, Store: st, StateDir: dir,
		Throttle: auth.NewThrottle(1000, 1<<20, time.Minute, nil)})
	if err != nil {
		st.Close()
		return nil, err
	}
	if err := b.Start(ctx); err != nil {
		st.Close()
		return nil, err
	}
	tc, err := tlsconf.Load(certFile, keyFile, dir, nil)
	if err != nil {
		st.Close()
		return nil, err
	}
	serve := func(run func(net.Listener) error) (string, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = run(ln) }()
		return "https://" + ln.Addr().String(), nil
	}
	r := &rig{st: st}
	pem, _ := os.ReadFile(certFile)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, MaxIdleConnsPerHost: 4 * o.Concurrency, ForceAttemptHTTP2: true}
	r.client = &http.Client{Timeout: time.Minute, Transport: transport}
	r.noRedirect = &http.Client{Transport: transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if r.broker, err = serve(func(ln net.Listener) error { return b.Serve(ctx, ln, tc) }); err != nil {
		return nil, err
	}
	adm := &obs.Admin{Log: quiet, Registry: prometheus.NewRegistry(), Tokens: []string{adminToken}, ConsoleTokens: []string{consoleToken},
		API:      []*http.ServeMux{b.AdminHandler()},
		Throttle: auth.NewThrottle(1000, 1<<20, time.Minute, nil)}
	if r.admin, err = serve(func(ln net.Listener) error { return adm.Serve(ctx, ln, tc) }); err != nil {
		return nil, err
	}
	cfg.Web.Console.API = r.admin
	// As in deskway up, the portal calls the broker of its own process
	// without a socket (web.broker left empty).
	p, err := web.New(cfg.Web, web.Deps{Logger: quiet, Users: us, Throttle: auth.NewThrottle(1000, 1<<20, time.Minute, nil),
		Broker:    b.Local(3),
		CookieKey: []byte("portalbench-cookie-key-0123456789abcdef"), AdminAPI: r.client})
	if err != nil {
		return nil, err
	}
	if r.portal, err = serve(func(ln net.Listener) error { return p.Serve(ctx, ln, tc) }); err != nil {
		return nil, err
	}
	bc := &brokerclient.Client{Base: r.broker, HTTP: r.client}
	join, _ := tokens.MintJoin("desk", "", time.Hour, 0)
	for i := range o.Hosts {
		name := fmt.Sprintf("host%02d", i)
		res, err := bc.Register(ctx, join, brokerapi.RegisterRequest{Name: name, Address: name + ".bench", Port: 3389})
		if err != nil {
			return nil, fmt.Errorf("portalbench: register %s: %w", name, err)
		}
		if _, err := bc.Heartbeat(ctx, res.Credential, brokerapi.Heartbeat{Host: name, DiskIdle: 0.9, Sessions: []brokerapi.Session{}}); err != nil {
			return nil, err
		}
		r.creds = append(r.creds, res.Credential)
	}
	return r, nil
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// The load generators share the two cores with what they measure, so
// both are kept lean alike: one connection pool, a deadline per launch
// rather than a timer per request, no cookie jar (the portal's one cookie
// is carried by hand, as a browser would carry it) and no redirect
// followed unasked.

// portalLaunch is one person at the portal: sign in, the desktops page
// the sign-in leads to, Launch; it checks the answer is an .rdp file for
// the user.
func (r *rig) portalLaunch(ctx context.Context, user string) error {
	var cookie string
	do := func(method, path string, form url.Values) (*http.Response, []byte, error) {
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, _ := http.NewRequestWithContext(ctx, method, r.portal+path, body)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := r.noRedirect.Do(req)
		if err != nil {
			return nil, nil, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, b, err
	}
	resp, _, err := do("POST", "/signin", url.Values{"user": {user}, "password": {password}})
	if err != nil {
		return err
	}
	cs := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || len(cs) != 1 {
		return fmt.Errorf("portal: signing in as %s: %s to %q with %d cookies", user, resp.Status, resp.Header.Get("Location"), len(cs))
	}
	cookie = cs[0].Name + "=" + cs[0].Value
	resp, page, err := do("GET", "/", nil)
	if err != nil {
		return err
	}
	m := csrfField.FindSubmatch(page)
	if resp.StatusCode != http.StatusOK || m == nil || !bytes.Contains(page, []byte(`data-group="desk"`)) {
		return fmt.Errorf("portal: the desktops page of %s: %s", user, resp.Status)
	}
	resp, rdp, err := do("POST", "/launch", url.Values{"csrf": {string(m[1])}, "delivery_group": {"desk"}})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(rdp, []byte("gatewayaccesstoken:s:")) {
		return fmt.Errorf("portal: launch for %s: %s", user, resp.Status)
	}
	return nil
}

// apiLaunch is the same user launching through the broker's API.
func (r *rig) apiLaunch(ctx context.Context, user string) error {
	bc := &brokerclient.Client{Base: r.broker, HTTP: r.noRedirect}
	res, _, err := bc.Launch(ctx, brokerclient.Basic(user, password), brokerapi.LaunchRequest{DeliveryGroup: "desk"})
	if err != nil {
		return err
	}
	if !strings.Contains(res.RDP, "gatewayaccesstoken:s:") {
		return errors.New("api: the answer holds no .rdp file")
	}
	return nil
}

// storm runs launch for every user at o.Concurrency and returns launches
// per second and the sorted response times.
// Users first..first+Users-1 launch, so that every run of every system
// launches new users (a second launch would be a reconnection).
func (o *Options) storm(ctx context.Context, launch func(context.Context, string) error, first int) (float64, []time.Duration, error) {
	lat := make([]time.Duration, o.Users)
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= o.Users || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				lctx, cancel := context.WithTimeout(ctx, time.Minute)
				err := launch(lctx, fmt.Sprintf("user%05d", first+i))
				cancel()
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	if firstErr != nil {
		return 0, nil, firstErr
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return float64(o.Users) / wall.Seconds(), lat, nil
}
