package web

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/deskway/deskway/internal/config"
)

// flowCookie carries one sign-in through the provider: the state that
// ties the callback to this browser, the nonce the ID token must echo,
// and the PKCE verifier. It lives ten minutes.
const (
	flowCookie   = "__Host-deskway-oidc"
	flowLifetime = 10 * time.Minute
)

// oidcLogin signs people in through an OpenID Connect provider. The
// provider is discovered on first use, and again after a failure, so a
// provider that is down at start does not stop the portal.
type oidcLogin struct {
	cfg      *config.OIDC
	client   *http.Client
	redirect string
	subjects *subjects

	mu       sync.Mutex
	provider *oidc.Provider
	logout   string // the provider's end_session_endpoint, if any
	failedAt time.Time
	failure  error
}

// discoveryBackoff is how long a failed discovery stands.
const discoveryBackoff = 15 * time.Second

func newOIDCLogin(cfg *config.OIDC, publicURL string, client *http.Client, subjects *subjects) *oidcLogin {
	return &oidcLogin{cfg: cfg, client: client, redirect: strings.TrimSuffix(publicURL, "/") + "/oidc/callback", subjects: subjects}
}

func (o *oidcLogin) ctx(ctx context.Context) context.Context {
	return oidc.ClientContext(ctx, o.client)
}

// discover returns the provider, fetching its configuration when it has
// not been fetched yet.
func (o *oidcLogin) discover(ctx context.Context) (*oidc.Provider, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.provider != nil {
		return o.provider, nil
	}
	// A provider that just failed is not asked again for a while: sign-ins
	// meanwhile are told at once instead of queueing behind its timeout.
	if time.Since(o.failedAt) < discoveryBackoff {
		return nil, o.failure
	}
	dctx, cancel := context.WithTimeout(o.ctx(ctx), 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(dctx, o.cfg.Issuer)
	if err != nil {
		o.failedAt, o.failure = time.Now(), fmt.Errorf("the identity provider %s: %w", o.cfg.Issuer, err)
		return nil, o.failure
	}
	var extra struct {
		EndSession string `json:"end_session_endpoint"`
	}
	_ = p.Claims(&extra)
	o.provider, o.logout = p, extra.EndSession
	return p, nil
}

func (o *oidcLogin) oauth(p *oidc.Provider) *oauth2.Config {
	return &oauth2.Config{ClientID: o.cfg.ClientID, ClientSecret: o.cfg.ClientSecret.Value(), Endpoint: p.Endpoint(),
		RedirectURL: o.redirect, Scopes: append([]string{oidc.ScopeOpenID}, o.cfg.Scopes...)}
}

// flow is what the flow cookie holds.
type flow struct {
	State    string `json:"s"`
	Nonce    string `json:"n"`
	Verifier string `json:"v"`
	Issued   int64  `json:"iat"`
}

func (s *Server) oidcStart(w http.ResponseWriter, r *http.Request) {
	p, err := s.oidc.discover(r.Context())
	if err != nil {
		s.d.Logger.Warn("OIDC discovery failed", "error", err)
		s.render(w, http.StatusBadGateway, "signin.html", s.signinData(page{Error: "The identity provider does not answer; try again later, or sign in with a local account."}))
		return
	}
	f := flow{State: newID(), Nonce: newID(), Verifier: oauth2.GenerateVerifier(), Issued: s.d.Now().Unix()}
	b, _ := json.Marshal(f)
	body := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: flowCookie, Value: body + "." + base64.RawURLEncoding.EncodeToString(s.codec.mac("oidc-flow", body)),
		Path: "/", Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode, MaxAge: int(flowLifetime.Seconds())})
	http.Redirect(w, r, s.oidc.oauth(p).AuthCodeURL(f.State, oidc.Nonce(f.Nonce), oauth2.S256ChallengeOption(f.Verifier)), http.StatusSeeOther)
}

// readFlow returns the request's flow cookie, checked.
func (s *Server) readFlow(r *http.Request) (flow, error) {
	c, err := r.Cookie(flowCookie)
	if err != nil {
		return flow{}, errors.New("no sign-in in progress in this browser (it may have taken over ten minutes)")
	}
	body, sig, _ := strings.Cut(c.Value, ".")
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || subtle.ConstantTimeCompare(got, s.codec.mac("oidc-flow", body)) != 1 {
		return flow{}, errors.New("the sign-in cookie is not this portal's")
	}
	b, _ := base64.RawURLEncoding.DecodeString(body)
	var f flow
	if err := json.Unmarshal(b, &f); err != nil || s.d.Now().Sub(time.Unix(f.Issued, 0)) > flowLifetime {
		return flow{}, errors.New("the sign-in took over ten minutes")
	}
	return f, nil
}

func (s *Server) oidcCallback(w http.ResponseWriter, r *http.Request) {
	fail := func(status int, why string, err error) {
		s.signins.WithLabelValues("oidc_refused").Inc()
		s.d.Logger.Warn("OIDC sign-in refused", "reason", why, "error", err, "remote", r.RemoteAddr)
		s.render(w, status, "signin.html", s.signinData(page{Error: why}))
	}
	http.SetCookie(w, &http.Cookie{Name: flowCookie, Value: "", Path: "/", Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode, MaxAge: -1})
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		// Anyone can send a browser here with words of their choosing:
		// the page says only the portal's own sentence for a registered
		// error code, the log what the link said.
		why, ok := providerErrors[e]
		if !ok {
			why = "The identity provider did not sign you in."
		}
		fail(http.StatusUnauthorized, why, errors.New(firstLine(e+" "+q.Get("error_description"))))
		return
	}
	f, err := s.readFlow(r)
	if err != nil {
		fail(http.StatusBadRequest, "Sign-in failed: "+err.Error()+". Start again.", err)
		return
	}
	if subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(f.State)) != 1 {
		fail(http.StatusBadRequest, "Sign-in failed: the answer is not for this browser's sign-in. Start again.", nil)
		return
	}
	p, err := s.oidc.discover(r.Context())
	if err != nil {
		fail(http.StatusBadGateway, "The identity provider does not answer; try again later.", err)
		return
	}
	ctx := s.oidc.ctx(r.Context())
	oc := s.oidc.oauth(p)
	tok, err := oc.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(f.Verifier))
	if err != nil {
		fail(http.StatusBadGateway, "Sign-in failed: the identity provider refused the code.", err)
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	idt, err := p.Verifier(&oidc.Config{ClientID: s.oidc.cfg.ClientID, Now: s.d.Now}).Verify(ctx, raw)
	if err != nil {
		fail(http.StatusBadGateway, "Sign-in failed: the identity provider's ID token is not valid.", err)
		return
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(f.Nonce)) != 1 {
		fail(http.StatusBadRequest, "Sign-in failed: the ID token is not for this sign-in. Start again.", nil)
		return
	}
	claims := map[string]any{}
	if err := idt.Claims(&claims); err != nil {
		fail(http.StatusBadGateway, "Sign-in failed: the ID token's claims cannot be read.", err)
		return
	}
	if _, ok := claims[s.oidc.cfg.GroupsClaim]; !ok || claims[s.oidc.cfg.UsernameClaim] == nil {
		// Providers that keep the ID token small give the rest at userinfo.
		if ui, err := p.UserInfo(ctx, oc.TokenSource(ctx, tok)); err == nil {
			more := map[string]any{}
			if ui.Claims(&more) == nil && more["sub"] == idt.Subject {
				for k, v := range more {
					if _, ok := claims[k]; !ok {
						claims[k] = v
					}
				}
			}
		}
	}
	user, _ := claims[s.oidc.cfg.UsernameClaim].(string)
	_, mapped := s.oidc.cfg.Accounts[idt.Subject]
	if !mapped && !plainUserName(user) {
		s.d.Logger.Warn("a provider user name the portal does not take; map the subject in web.oidc.accounts", "subject", idt.Subject, "claim", s.oidc.cfg.UsernameClaim)
		fail(http.StatusForbidden, fmt.Sprintf("Sign-in failed: the identity provider's user name (claim %q) is not one this portal takes: only letters, digits, '.', '_' and '-'. An administrator can give your account (subject %q) a name in web.oidc.accounts.", s.oidc.cfg.UsernameClaim, idt.Subject), nil)
		return
	}
	name := s.oidc.account(idt.Subject, user)
	if !mapped {
		// A name is the first subject's that used it: a renamed or
		// recycled provider name must not inherit the earlier person's
		// sessions.
		other, err := s.oidc.subjects.bind(name, idt.Subject)
		if err != nil {
			s.d.Logger.Warn("a provider user's subject holds until this portal restarts: it could not be kept on disk", "user", name, "error", err)
		}
		if other != "" {
			s.d.Logger.Warn("a provider user name belongs to another subject; refused", "user", name, "subject", idt.Subject, "bound_to", other)
			fail(http.StatusForbidden, fmt.Sprintf("Sign-in failed: the name %s already belongs to another account at the identity provider. An administrator can give your account (subject %q) a name in web.oidc.accounts.", name, idt.Subject), nil)
			return
		}
	}
	if s.isLocal(name) {
		// Names at a provider are often the user's to choose.
		fail(http.StatusForbidden, fmt.Sprintf("Sign-in failed: %q is the name of a local account of this portal; an administrator renames one of the two.", user), nil)
		return
	}
	groups := stringList(claims[s.oidc.cfg.GroupsClaim])
	now := s.d.Now().Unix()
	s.setCookie(w, signIn{ID: newID(), User: name, Groups: groups, Issued: now, Seen: now, Via: "oidc", Sub: idt.Subject})
	s.signins.WithLabelValues("oidc").Inc()
	s.d.Logger.Info("portal sign-in", "user", name, "via", "oidc", "subject", idt.Subject, "groups", groups, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// account is the name a provider user signs in as: the account
// web.oidc.accounts maps their subject to, or their name qualified with
// the provider's namespace, so that a provider user named carol is not
// the directory's carol, whose sessions the broker keys by that name.
func (o *oidcLogin) account(subject, user string) string {
	if a, ok := o.cfg.Accounts[subject]; ok {
		return a
	}
	return user + "@" + o.cfg.Namespace
}

// isAccount reports whether name is the one account() gives now to the
// provider user subject: the configuration may have changed since.
func (o *oidcLogin) isAccount(subject, name string) bool {
	if a, ok := o.cfg.Accounts[subject]; ok {
		return a == name
	}
	return strings.HasSuffix(name, "@"+o.cfg.Namespace) && o.subjects.holds(name, subject)
}

// endSession is where sign-out sends a person who signed in through the
// provider, so that they are signed out there too; "" when the provider
// offers no logout.
func (o *oidcLogin) endSession(ctx context.Context, publicURL string) string {
	if _, err := o.discover(ctx); err != nil || o.logout == "" {
		return ""
	}
	q := url.Values{"client_id": {o.cfg.ClientID}, "post_logout_redirect_uri": {strings.TrimSuffix(publicURL, "/") + "/signin"}}
	sep := "?"
	if strings.Contains(o.logout, "?") {
		sep = "&"
	}
	return o.logout + sep + q.Encode()
}

// providerErrors are the error codes OAuth 2.0 (RFC 6749 4.1.2.1) and
// OpenID Connect Core (3.1.2.6) register for an authorization answer,
// each with what a person is told.
var providerErrors = func() map[string]string {
	const (
		denied   = "The identity provider did not sign you in: access was denied."
		needs    = "The identity provider needs you to sign in or confirm there first; start again."
		trouble  = "The identity provider could not sign you in right now; try again later."
		settings = "The identity provider refused the portal's sign-in request; ask your administrator to check the portal's provider settings."
	)
	m := map[string]string{"access_denied": denied, "server_error": trouble, "temporarily_unavailable": trouble}
	for _, c := range []string{"login_required", "interaction_required", "consent_required", "account_selection_required"} {
		m[c] = needs
	}
	for _, c := range []string{"invalid_request", "unauthorized_client", "unsupported_response_type", "invalid_scope",
		"invalid_request_uri", "invalid_request_object", "request_not_supported", "request_uri_not_supported", "registration_not_supported"} {
		m[c] = settings
	}
	return m
}()

// stringList reads a claim that is a list of strings (or one string).
func stringList(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok && s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
