// Package web is the user portal: people sign in with the organisation's
// accounts, see the desktops they may launch (with a session to return
// to, if they have one) and download an .rdp file that reaches it through
// the gateway with a signed token, so the gateway asks no password. It is
// a front end of the broker, over the broker's own API, and serves its
// pages, styles and nothing else from the binary.
package web

import (
	"context"
	"crypto/tls"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
)

//go:embed templates/*.html static/*
var assets embed.FS

// cookieName is the sign-in cookie's; the __Host- prefix makes browsers
// refuse it unless it is Secure, for the whole site and no other domain.
const cookieName = "__Host-deskway"

// Deps are what the portal needs from outside.
type Deps struct {
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// Users are the local accounts people sign in with.
	Users *auth.Users
	// Throttle locks out users and addresses after repeated bad passwords.
	Throttle *auth.Throttle
	// Broker is the broker the portal asks, as a front end, for a user's
	// desktops and launches.
	Broker Broker
	// CookieKey signs sign-in cookies (32 bytes or more).
	CookieKey []byte
	// OIDCClient is the HTTP client for the OIDC provider (its CA).
	OIDCClient *http.Client
	// LDAPTLS checks the directory's certificate (web.ldap).
	LDAPTLS *tls.Config
	// AdminAPI is the client the console calls the admin API with (it
	// trusts the admin listener's certificate).
	AdminAPI *http.Client
	// StateDir keeps the sign-outs across restarts; empty keeps them in
	// memory only.
	StateDir string
	Now      func() time.Time
}

// Broker is what the portal asks a broker on a signed-in user's behalf:
// brokerclient.FrontEnd over HTTPS, or broker.Local in the broker's own
// process. The broker's refusals are *brokerclient.StatusError.
type Broker interface {
	Desktops(ctx context.Context, req brokerapi.DesktopsRequest) ([]brokerapi.Desktop, error)
	Launch(ctx context.Context, req brokerapi.LaunchRequest) (*brokerapi.LaunchResponse, error)
	Logoff(ctx context.Context, session string, req brokerapi.DesktopsRequest) (*brokerapi.CommandStatus, error)
	SessionEnd(ctx context.Context, session string, since time.Time, req brokerapi.DesktopsRequest) (*brokerapi.SessionEnd, error)
}

// Server is the portal.
type Server struct {
	cfg      *config.Web
	d        Deps
	codec    cookieCodec
	pages    map[string]*template.Template
	signins  *prometheus.CounterVec
	launches *prometheus.CounterVec
	oidc     *oidcLogin // nil without web.oidc
	ldap     *ldapLogin // nil without web.ldap
	console  *console   // nil without web.console
	revoked  *revocations
	// browserClient is whether the binary embeds the browser RDP client;
	// browserPage is the page that runs it.
	browserClient bool
	browserPage   *template.Template
}

// New builds the portal.
func New(cfg *config.Web, d Deps) (*Server, error) {
	if d.Logger == nil || d.Users == nil || d.Broker == nil {
		return nil, errors.New("web: logger, users and broker are required")
	}
	if len(d.CookieKey) < 32 {
		return nil, errors.New("web: the cookie key must be at least 32 bytes")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Throttle == nil {
		d.Throttle = auth.NewThrottle(5, 20, 5*time.Minute, d.Now)
	}
	revoked, err := loadRevocations(d.StateDir, d.Now(), d.Logger)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, d: d, codec: cookieCodec{key: d.CookieKey}, pages: map[string]*template.Template{}, revoked: revoked,
		signins: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_web_signins_total",
			Help: "Portal sign-ins by result: ok (local account), ldap, oidc, wrong (user or password), throttled, oidc_refused, ldap_unreachable."}, []string{"result"}),
		launches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "deskway_web_launches_total",
			Help: "Launches through the portal by result: ok, refused (by the broker), error."}, []string{"result"}),
	}
	if d.Registry != nil {
		d.Registry.MustRegister(s.signins, s.launches)
	}
	if cfg.Console != nil {
		hc := d.AdminAPI
		if hc == nil {
			hc = &http.Client{Timeout: 30 * time.Second}
		}
		s.console = &console{cfg: cfg.Console, client: hc,
			charts: sampler{client: hc, url: strings.TrimSuffix(cfg.Console.API, "/") + "/metrics"}}
	}
	if cfg.LDAP != nil {
		tc := d.LDAPTLS
		if tc == nil {
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		s.ldap = &ldapLogin{cfg: cfg.LDAP, tls: tc, slots: make(chan struct{}, 32), checks: make(chan struct{}, 16)}
	}
	if cfg.OIDC != nil {
		hc := d.OIDCClient
		if hc == nil {
			hc = &http.Client{Timeout: 30 * time.Second}
		}
		subs, err := loadSubjects(d.StateDir)
		if err != nil {
			return nil, err
		}
		s.oidc = newOIDCLogin(cfg.OIDC, cfg.PublicURL, hc, subs)
	}
	layout, err := template.New("layout.html").Funcs(template.FuncMap{"since": since, "pct": pct, "bytes": humanBytes, "rate": rate, "join": strings.Join, "lastUsed": lastUsed}).ParseFS(assets, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("web: %w", err)
	}
	s.browserClient = browserClientBuilt()
	if !s.browserClient {
		d.Logger.Warn("the portal has no browser client: this binary was built without `make assets`, so desktops open only as .rdp files")
	}
	if s.browserPage, err = template.ParseFS(assets, "templates/browser.html"); err != nil {
		return nil, fmt.Errorf("web: %w", err)
	}
	for _, page := range []string{"signin.html", "desktops.html", "console.html"} {
		t, err := template.Must(layout.Clone()).ParseFS(assets, "templates/"+page)
		if err != nil {
			return nil, fmt.Errorf("web: %w", err)
		}
		s.pages[page] = t
	}
	return s, nil
}

// Handler serves the portal. Every request that changes something must
// come from the portal's own pages: the browser's cross-origin check
// (Sec-Fetch-Site, Origin) and the sign-in's CSRF token both hold.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /signin", s.signinPage)
	mux.HandleFunc("POST /signin", s.signin)
	mux.HandleFunc("POST /signout", s.signout)
	if s.console != nil {
		s.consoleRoutes(mux)
	}
	if s.oidc != nil {
		mux.HandleFunc("GET /oidc/login", s.oidcStart)
		mux.HandleFunc("GET /oidc/callback", s.oidcCallback)
	}
	mux.HandleFunc("POST /launch", s.launch)
	mux.HandleFunc("POST /browser", s.openInBrowser)
	mux.HandleFunc("POST /browser/end", s.browserEnd)
	mux.HandleFunc("POST /browser/pass", s.browserPass)
	mux.HandleFunc("POST /logoff", s.logoff)
	mux.HandleFunc("GET /{$}", s.desktops)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.d.Logger.Warn("cross-site request refused", "method", r.Method, "path", r.URL.Path, "origin", r.Header.Get("Origin"), "remote", r.RemoteAddr)
		http.Error(w, "cross-site request refused: use the portal's own pages", http.StatusForbidden)
	}))
	formAction := "'self'"
	if s.oidc != nil {
		// Sign-out posts to the portal, which sends the browser on to the
		// provider's logout: a redirect the form-action rule covers.
		if u, err := url.Parse(s.oidc.cfg.Issuer); err == nil {
			formAction += " " + u.Scheme + "://" + u.Host
		}
	}
	return headers(cop.Handler(mux), formAction)
}

// headers sets what every answer carries: no framing, no sniffing, no
// scripts or styles from elsewhere, forms only to formAction, nothing
// cached.
func headers(h http.Handler, formAction string) http.Handler {
	csp := "default-src 'self'; frame-ancestors 'none'; form-action " + formAction + "; base-uri 'none'"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", csp)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Strict-Transport-Security", "max-age=31536000")
		if !isStatic(r.URL.Path) {
			hd.Set("Cache-Control", "no-store")
		}
		h.ServeHTTP(w, r)
	})
}

func isStatic(p string) bool { return strings.HasPrefix(p, "/static/") }

// Serve serves the portal over TLS on ln until ctx ends, then lets
// requests in flight finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener, tc *tls.Config) error {
	// A copy: ServeTLS adds its protocols to the config, which other roles share.
	srv := &http.Server{Handler: s.Handler(), TLSConfig: tc.Clone(), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 32 << 10, ErrorLog: slog.NewLogLogger(s.d.Logger.Handler(), slog.LevelDebug)}
	// HTTP/1.1 only. The portal's pages are a handful of requests, which
	// browsers spread over their six connections as well; Go's HTTP/2
	// server spends more CPU per request (a goroutine and frame scheduling
	// each), which a sign-in storm pays: the portal bench measured 3,100
	// against 2,500 launches per second. And it leaves HTTP/2's floods
	// (rapid reset, CONTINUATION) out of the portal's surface.
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	if s.console != nil {
		go s.console.charts.run(ctx, s.console.charts.client, s.console.charts.url)
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// current returns the request's sign-in, renewing its idle time.
func (s *Server) current(w http.ResponseWriter, r *http.Request) (signIn, bool) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return signIn{}, false
	}
	now := s.d.Now()
	si, err := s.codec.decode(c.Value, now, s.cfg.SessionIdle.D(), s.cfg.SessionMax.D())
	if err == nil && s.revoked.has(si, now) {
		err = errors.New("web: signed out")
	}
	if err == nil && si.Via == "" {
		// A local account is read afresh: one removed, or moved out of a
		// group, loses what it gave at once, not at the cookie's end.
		if u, found := s.d.Users.Lookup(si.User); found && u.Name == si.User {
			si.Groups = u.Groups
		} else {
			err = errors.New("web: the local account is gone")
		}
	}
	if err == nil && si.Via == "oidc" && (s.oidc == nil || !s.oidc.isAccount(si.Sub, si.User)) {
		// A sign-in from before the provider's users were qualified, or
		// before the namespace or a mapping changed, is not one of its
		// names now.
		err = errors.New("web: the provider sign-in's name is not one the configuration gives")
	}
	keep := false
	if err == nil && si.Via == "ldap" {
		if s.ldap == nil {
			err = errors.New("web: directory sign-ins are off (no web.ldap)")
		} else {
			keep, err = s.recheckDirectory(r, &si, now)
		}
	}
	if err != nil {
		if !keep {
			s.clearCookie(w)
		}
		return signIn{}, false
	}
	// Renew at most once a minute, so that a page's requests do not each
	// set a cookie; a console's own live updates (live.js) renew nothing,
	// so a console left open still ends when idle.
	if now.Unix()-si.Seen >= 60 && r.Header.Get("Deskway-Live") == "" {
		si.Seen = now.Unix()
		s.setCookie(w, si)
	}
	return si, true
}

func (s *Server) setCookie(w http.ResponseWriter, si signIn) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: s.codec.encode(si), Path: "/", Secure: true, HttpOnly: true,
		SameSite: http.SameSiteLaxMode, MaxAge: int(s.cfg.SessionMax.D().Seconds())})
}

func (s *Server) clearCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", Secure: true, HttpOnly: true,
		SameSite: http.SameSiteLaxMode, MaxAge: -1})
}

// page is what every template gets.
type page struct {
	Title    string
	User     string
	CSRF     string
	Error    string
	Notice   string
	Name     string // the user name typed, kept on a failed sign-in
	Desktops []listed
	// Find is the desktops page's search, offered once a user has
	// searchFrom desktops.
	Find *desktopSearch
	// OIDCLabel is the provider's sign-in button, when there is one.
	OIDCLabel string
	// Console is the admin console's page, when this is one.
	Console *consoleData
	// ConsoleLink shows the way to the console to those with a role.
	ConsoleLink bool
	// Browser offers "Open in browser" beside Launch.
	Browser bool
}

// isLocal reports whether name, as the broker would read it (any case,
// with or without a domain), is a local account's: a name from a provider
// or a directory must not become that account.
func (s *Server) isLocal(name string) bool {
	_, found := s.d.Users.Lookup(name)
	return found
}

// signinData adds what the sign-in page shows beside the form.
func (s *Server) signinData(p page) page {
	if s.oidc != nil {
		p.OIDCLabel = s.oidc.cfg.Label
	}
	return p
}

func (s *Server) render(w http.ResponseWriter, status int, name string, p page) {
	p.Title = s.cfg.Title
	if p.Console != nil {
		p.ConsoleLink = true
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := s.pages[name].ExecuteTemplate(w, "layout.html", p); err != nil {
		s.d.Logger.Warn("rendering a page", "page", name, "error", err)
	}
}

func (s *Server) signinPage(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.current(w, r); ok {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.render(w, http.StatusOK, "signin.html", s.signinData(page{Notice: notice(r)}))
}

func remoteAddr(r *http.Request) netip.Addr {
	ap, _ := netip.ParseAddrPort(r.RemoteAddr)
	return ap.Addr()
}

func (s *Server) signout(w http.ResponseWriter, r *http.Request) {
	si, ok := s.current(w, r)
	if ok && !s.codec.checkCSRF(si, r.PostFormValue("csrf")) {
		http.Error(w, "the form is stale: reload the page", http.StatusForbidden)
		return
	}
	s.clearCookie(w)
	if ok {
		// A copy of the cookie kept elsewhere no longer signs in here.
		if err := s.revoked.add(si, time.Unix(si.Issued, 0).Add(s.cfg.SessionMax.D()), s.d.Now()); err != nil {
			s.d.Logger.Warn("a sign-out holds until this portal restarts: it could not be kept on disk", "user", si.User, "error", err)
		}
		s.d.Logger.Info("portal sign-out", "user", si.User)
	}
	if ok && si.Via == "oidc" && s.oidc != nil {
		if to := s.oidc.endSession(r.Context(), s.cfg.PublicURL); to != "" {
			http.Redirect(w, r, to, http.StatusSeeOther)
			return
		}
	}
	http.Redirect(w, r, withNotice("/signin", "signed-out"), http.StatusSeeOther)
}

func (s *Server) desktops(w http.ResponseWriter, r *http.Request) {
	si, ok := s.current(w, r)
	if !ok {
		http.Redirect(w, r, "/signin", http.StatusSeeOther)
		return
	}
	p := page{User: si.User, CSRF: s.codec.csrf(si), Notice: notice(r)}
	p.ConsoleLink = s.console != nil && s.console.role(si) != ""
	p.Browser = s.browserClient
	ds, err := s.d.Broker.Desktops(r.Context(), forUser(si))
	if err != nil {
		s.d.Logger.Warn("listing a user's desktops", "user", si.User, "error", err)
		p.Error = "Your desktops cannot be listed right now. Try again in a moment."
		s.render(w, http.StatusBadGateway, "desktops.html", p)
		return
	}
	if len(ds) == 0 && p.ConsoleLink && p.Notice == "" {
		// An administrator with no desktop of their own came for the
		// console.
		http.Redirect(w, r, "/admin/", http.StatusSeeOther)
		return
	}
	p.Desktops, p.Find = arrange(ds, r.URL.Query().Get("q"))
	s.render(w, http.StatusOK, "desktops.html", p)
}

// checkForm bounds a posted form and checks that it carries si's CSRF
// token, answering 403 when it does not.
func (s *Server) checkForm(w http.ResponseWriter, r *http.Request, si signIn) bool {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if !s.codec.checkCSRF(si, r.PostFormValue("csrf")) {
		http.Error(w, "the form is stale: reload the page", http.StatusForbidden)
		return false
	}
	return true
}

// forUser is the broker request body naming si's user and groups.
func forUser(si signIn) brokerapi.DesktopsRequest {
	return brokerapi.DesktopsRequest{User: si.User, Groups: si.Groups}
}

// desktopsFailed shows the desktops page with what went wrong.
func (s *Server) desktopsFailed(w http.ResponseWriter, r *http.Request, si signIn, msg string) {
	p := page{User: si.User, CSRF: s.codec.csrf(si), Error: msg, Browser: s.browserClient}
	if ds, err := s.d.Broker.Desktops(r.Context(), forUser(si)); err == nil {
		p.Desktops, p.Find = arrange(ds, "")
	}
	s.render(w, http.StatusBadGateway, "desktops.html", p)
}

var fileName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func (s *Server) launch(w http.ResponseWriter, r *http.Request) {
	si, ok := s.current(w, r)
	if !ok {
		http.Redirect(w, r, "/signin", http.StatusSeeOther)
		return
	}
	if !s.checkForm(w, r, si) {
		return
	}
	group := r.PostFormValue("delivery_group")
	res, ok := s.startDesktop(w, r, si, group)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/x-rdp")
	w.Header().Set("Content-Disposition", `attachment; filename="`+fileName.ReplaceAllString(group, "_")+`.rdp"`)
	_, _ = w.Write([]byte(res.RDP))
}

// startDesktop asks the broker for a session of group for si's user. When
// it fails it has shown the desktops page with the reason.
func (s *Server) startDesktop(w http.ResponseWriter, r *http.Request, si signIn, group string) (*brokerapi.LaunchResponse, bool) {
	res, err := s.d.Broker.Launch(r.Context(), brokerapi.LaunchRequest{DeliveryGroup: group, User: si.User, Groups: si.Groups})
	if err != nil {
		result := "error"
		var se *brokerclient.StatusError
		if errors.As(err, &se) {
			result = "refused"
		}
		s.launches.WithLabelValues(result).Inc()
		s.d.Logger.Warn("portal launch failed", "user", si.User, "delivery_group", group, "error", err)
		s.desktopsFailed(w, r, si, launchRefusal(group, err))
		return nil, false
	}
	s.launches.WithLabelValues("ok").Inc()
	s.d.Logger.Info("portal launch", "user", si.User, "delivery_group", group, "host", res.Host, "reconnect", res.Reconnect)
	return res, true
}

// logoff logs the user's own session off, through its host's agent.
func (s *Server) logoff(w http.ResponseWriter, r *http.Request) {
	si, ok := s.current(w, r)
	if !ok {
		http.Redirect(w, r, "/signin", http.StatusSeeOther)
		return
	}
	if !s.checkForm(w, r, si) {
		return
	}
	group := r.PostFormValue("delivery_group")
	_, err := s.d.Broker.Logoff(r.Context(), r.PostFormValue("session"), forUser(si))
	if err != nil {
		s.d.Logger.Warn("portal logoff failed", "user", si.User, "error", err)
		s.desktopsFailed(w, r, si, logoffRefusal(err))
		return
	}
	s.d.Logger.Info("portal logoff", "user", si.User, "delivery_group", group)
	http.Redirect(w, r, withNotice("/", "logoff"), http.StatusSeeOther)
}

// pct shows a 0-1 fraction as a percentage.
func pct(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }

// rate shows a count per second for a person: tenths where they matter,
// thousands as k.
func rate(f float64) string {
	switch {
	case f == 0:
		return "0"
	case f >= 10000:
		return fmt.Sprintf("%.0fk", f/1000)
	case f >= 1000:
		return fmt.Sprintf("%.1fk", f/1000)
	case f >= 10:
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%.1f", f)
}

// humanBytes shows a byte count with a unit.
func humanBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// since says how long ago t was, for a person.
func since(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	}
	return t.Local().Format("2 Jan 15:04")
}
