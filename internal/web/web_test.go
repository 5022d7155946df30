package web_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/web"
)

const tokenKey = "web-test-token-key-0123456789abcdef0123"

// clock is a settable time for cookie lifetimes.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

type portal struct {
	t     *testing.T
	srv   *httptest.Server
	clock *clock
	p     *web.Server
	// agent and hostCred send h1's heartbeats.
	agent    *brokerclient.Client
	hostCred string
	// handler is the portal's, which restart replaces with a new portal
	// on the same state directory, as a restarted process is.
	handler atomic.Value
	restart func()
	// stateDir is the portal's STATE_DIR.
	stateDir string
}

// newPortal starts a real broker (SQLite, one registered host) and the
// portal in front of it.
func newPortal(t *testing.T) *portal { return newPortalWith(t, nil) }

// newPortalWith is newPortal with identity providers: setup gets the
// portal's public URL and web section to add them to, and returns a
// client that trusts the OIDC provider, if there is one. A console setup
// adds without an api reads the broker's admin API.
func newPortalWith(t *testing.T, setup func(publicURL string, w *config.Web) *http.Client) *portal {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	publicURL := "https://" + srv.Listener.Addr().String()
	cfg := &config.Config{StateDir: t.TempDir(),
		Auth: config.Auth{TokenKey: config.NewSecret(tokenKey), Users: []config.User{
			{Name: "alice", Password: config.NewSecret("Alice-Pass-1"), Groups: []string{"staff"}},
			{Name: "bob", Password: config.NewSecret("Bob-Pass-1"), Groups: []string{"visitors"}},
		}},
		Broker: &config.Broker{Database: config.NewDatabaseURL(filepath.Join(t.TempDir(), "b.db")), Gateway: "gw.example.test:443",
			FrontendTokens: []config.Secret{config.NewSecret("portal-frontend-token")},
			DeliveryGroups: []config.DeliveryGrp{{Name: "desk", Description: "Office desktop", Groups: []string{"staff"}}}},
		Web: &config.Web{PublicURL: publicURL},
	}
	var oidcClient *http.Client
	if setup != nil {
		oidcClient = setup(publicURL, cfg.Web)
	}
	var admin *httptest.Server
	if cn := cfg.Web.Console; cn != nil && cn.API == "" {
		admin = httptest.NewUnstartedServer(nil)
		cn.API = "https://" + admin.Listener.Addr().String()
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := store.Open(ctx, cfg.Broker.Database.Value(), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	users, _ := auth.NewUsers(cfg.Auth.Users)
	tokens, _ := auth.NewTokens([]byte(tokenKey), nil)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := broker.New(cfg.Broker, broker.Deps{Logger: log, Users: users, Tokens: tokens, Store: st, StateDir: cfg.StateDir})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var adminAPI *http.Client
	if admin != nil {
		admin.Config.Handler = b.AdminHandler()
		admin.StartTLS()
		t.Cleanup(admin.Close)
		adminAPI = admin.Client()
	}
	bs := httptest.NewTLSServer(b.Handler())
	t.Cleanup(bs.Close)
	bc := &brokerclient.Client{Base: bs.URL, HTTP: bs.Client()}
	join, _ := tokens.MintJoin("desk", "", time.Hour, 0)
	reg, err := bc.Register(ctx, join, brokerapi.RegisterRequest{Name: "h1", Address: "h1.lan", Port: 3389})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bc.Heartbeat(ctx, reg.Credential, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9, Sessions: []brokerapi.Session{}}); err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Now()}
	deps := web.Deps{Logger: log, Users: users, Broker: brokerclient.FrontEnd{Client: bc, Token: cfg.Web.FrontendToken.Value()},
		CookieKey: []byte("web-test-cookie-key-0123456789abcdef"), OIDCClient: oidcClient, AdminAPI: adminAPI, Now: c.now,
		StateDir: cfg.StateDir}
	p, err := web.New(cfg.Web, deps)
	if err != nil {
		t.Fatal(err)
	}
	pt := &portal{t: t, srv: srv, clock: c, p: p, agent: bc, hostCred: reg.Credential, stateDir: cfg.StateDir}
	pt.handler.Store(p.Handler())
	pt.restart = func() {
		t.Helper()
		np, err := web.New(cfg.Web, deps)
		if err != nil {
			t.Fatal(err)
		}
		pt.p = np
		pt.handler.Store(np.Handler())
	}
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { pt.handler.Load().(http.Handler).ServeHTTP(w, r) })
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return pt
}

// do sends a request as a browser on the portal's own pages would.
func (p *portal) do(method, path string, form url.Values, cookie *http.Cookie, hdr map[string]string) *http.Response {
	p.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, p.srv.URL+path, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if cookie != nil {
		req.AddCookie(cookie)
	}
	c := p.srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func read(r *http.Response) string { b, _ := io.ReadAll(r.Body); return string(b) }

func (p *portal) signIn(user, pw string) *http.Cookie {
	p.t.Helper()
	resp := p.do("POST", "/signin", url.Values{"user": {user}, "password": {pw}}, nil, nil)
	if resp.StatusCode != http.StatusSeeOther {
		p.t.Fatalf("sign-in as %s: %s %s", user, resp.Status, read(resp))
	}
	for _, c := range resp.Cookies() {
		if c.Name == "__Host-deskway" {
			return c
		}
	}
	p.t.Fatal("no sign-in cookie")
	return nil
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func TestSignInListLaunchSignOut(t *testing.T) {
	p := newPortal(t)
	if r := p.do("GET", "/", nil, nil, nil); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/signin" {
		t.Fatalf("/ before sign-in: %s %s", r.Status, r.Header.Get("Location"))
	}
	wrong := p.do("POST", "/signin", url.Values{"user": {"alice"}, "password": {"nope"}}, nil, nil)
	if body := read(wrong); wrong.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "Wrong user name or password") || len(wrong.Cookies()) != 0 {
		t.Fatalf("wrong password: %s %v\n%s", wrong.Status, wrong.Cookies(), body)
	}
	c := p.signIn("alice", "Alice-Pass-1")
	if !c.Secure || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Path != "/" || c.Domain != "" {
		t.Fatalf("cookie attributes: %+v", c)
	}
	page := p.do("GET", "/", nil, c, nil)
	body := read(page)
	if page.StatusCode != 200 || !strings.Contains(body, "<h2>desk</h2>") || !strings.Contains(body, "Office desktop") || !strings.Contains(body, "Not running.") {
		t.Fatalf("desktops page: %s\n%s", page.Status, body)
	}
	if csp := page.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Fatalf("Content-Security-Policy = %q", csp)
	}
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	csrf := m[1]
	if r := p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}}, c, nil); r.StatusCode != http.StatusForbidden {
		t.Fatalf("launch without the CSRF token: %s", r.Status)
	}
	if r := p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, c, map[string]string{"Sec-Fetch-Site": "cross-site"}); r.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site launch: %s", r.Status)
	}
	if r := p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, c, map[string]string{"Sec-Fetch-Site": "", "Origin": "https://evil.example"}); r.StatusCode != http.StatusForbidden {
		t.Fatalf("launch from another origin: %s", r.Status)
	}
	r := p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, c, nil)
	rdp := read(r)
	if r.StatusCode != 200 || r.Header.Get("Content-Type") != "application/x-rdp" ||
		r.Header.Get("Content-Disposition") != `attachment; filename="desk.rdp"` ||
		!strings.Contains(rdp, "gatewayaccesstoken:s:") || !strings.Contains(rdp, "full address:s:h1.lan") {
		t.Fatalf("launch: %s %v\n%s", r.Status, r.Header, rdp)
	}
	if body := read(p.do("GET", "/", nil, c, nil)); !strings.Contains(body, "Starting on h1.") || !strings.Contains(body, "Reconnect") {
		t.Fatalf("after the launch the page shows:\n%s", body)
	}
	// The session is logged off from the page; the host's agent is asked.
	page2 := read(p.do("GET", "/", nil, c, nil))
	if strings.Contains(page2, `action="/logoff"`) {
		t.Fatalf("a session still launching offers Log off:\n%s", page2)
	}
	// Another sign-in's token does not pass for this one.
	other := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, p.signIn("alice", "Alice-Pass-1"), nil)))[1]
	if r := p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {other}}, c, nil); r.StatusCode != http.StatusForbidden {
		t.Fatalf("launch with another sign-in's token: %s", r.Status)
	}
	out := p.do("POST", "/signout", url.Values{"csrf": {csrf}}, c, nil)
	if out.StatusCode != http.StatusSeeOther || out.Header.Get("Location") != "/signin?notice=signed-out" {
		t.Fatalf("sign-out: %s to %q", out.Status, out.Header.Get("Location"))
	}
	if body := read(p.do("GET", out.Header.Get("Location"), nil, nil, nil)); !strings.Contains(body, `<p class="notice" role="status">Signed out.</p>`) {
		t.Fatalf("the page after sign-out:\n%s", body)
	}
	if cs := out.Cookies(); len(cs) != 1 || cs[0].MaxAge >= 0 {
		t.Fatalf("sign-out left the cookie: %+v", cs)
	}
	// A copy of the cookie kept from before the sign-out no longer works.
	if r := p.do("GET", "/", nil, c, nil); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("the signed-out cookie still opens the page: %s", r.Status)
	}
}

// TestNoticesAreThePortals: a link from elsewhere cannot put its words on
// the portal's pages.
func TestNoticesAreThePortals(t *testing.T) {
	p := newPortal(t)
	c := p.signIn("alice", "Alice-Pass-1")
	if body := read(p.do("GET", "/?notice=Your+account+is+locked.+Call+0800", nil, c, nil)); strings.Contains(body, "0800") {
		t.Fatalf("an unsigned notice reached the page:\n%s", body)
	}
}

func TestUserWithNoDesktopsIsToldWhatToDo(t *testing.T) {
	p := newPortal(t)
	body := read(p.do("GET", "/", nil, p.signIn("bob", "Bob-Pass-1"), nil))
	if !strings.Contains(body, "You may launch no desktop") {
		t.Fatalf("bob's page:\n%s", body)
	}
}

func TestCookieIsSignedAndExpires(t *testing.T) {
	p := newPortal(t)
	c := p.signIn("alice", "Alice-Pass-1")
	forged := *c
	forged.Value = strings.Replace(c.Value, ".", "x.", 1)
	if r := p.do("GET", "/", nil, &forged, nil); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("a tampered cookie was taken: %s", r.Status)
	}
	// Idle: 29 minutes between requests keep it; 31 end it.
	for range 3 {
		p.clock.add(29 * time.Minute)
		r := p.do("GET", "/", nil, c, nil)
		if r.StatusCode != 200 {
			t.Fatalf("after 29 idle minutes: %s", r.Status)
		}
		for _, nc := range r.Cookies() {
			if nc.Name == c.Name {
				c = nc // the renewed cookie
			}
		}
	}
	p.clock.add(31 * time.Minute)
	if r := p.do("GET", "/", nil, c, nil); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("after 31 idle minutes: %s", r.Status)
	}
	// Absolute: however busy, 12 hours end it.
	c = p.signIn("alice", "Alice-Pass-1")
	for elapsed := 20 * time.Minute; ; elapsed += 20 * time.Minute {
		p.clock.add(20 * time.Minute)
		r := p.do("GET", "/", nil, c, nil)
		if elapsed > 12*time.Hour {
			if r.StatusCode != http.StatusSeeOther {
				t.Fatalf("a sign-in lived %s", elapsed)
			}
			return
		}
		if r.StatusCode != 200 && elapsed < 12*time.Hour {
			t.Fatalf("a busy sign-in ended after %s", elapsed)
		}
		for _, nc := range r.Cookies() {
			if nc.Name == c.Name {
				c = nc
			}
		}
	}
}

func TestSignInThrottle(t *testing.T) {
	p := newPortal(t)
	var last *http.Response
	for range 6 {
		last = p.do("POST", "/signin", url.Values{"user": {"alice"}, "password": {"guess"}}, nil, nil)
	}
	if last.StatusCode != http.StatusTooManyRequests || last.Header.Get("Retry-After") == "" {
		t.Fatalf("sixth wrong password: %s", last.Status)
	}
	// Locked out, the right password is refused too.
	if r := p.do("POST", "/signin", url.Values{"user": {"alice"}, "password": {"Alice-Pass-1"}}, nil, nil); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("right password while locked out: %s", r.Status)
	}
}

// TestServeSpeaksHTTP1: the portal's own listener answers a client that
// offers HTTP/2 with HTTP/1.1 (see Serve for why).
func TestServeSpeaksHTTP1(t *testing.T) {
	p := newPortal(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// A config with no protocols of its own, as deskway's roles share.
	tc := &tls.Config{Certificates: p.srv.TLS.Certificates}
	go func() { done <- p.p.Serve(ctx, ln, tc) }()
	defer func() { cancel(); <-done }()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}}
	resp, err := c.Get("https://" + ln.Addr().String() + "/signin")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Proto != "HTTP/1.1" || resp.TLS.NegotiatedProtocol == "h2" {
		t.Fatalf("portal answered %s over %s (ALPN %q)", resp.Status, resp.Proto, resp.TLS.NegotiatedProtocol)
	}
}
