package web_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// oidcPortal is a portal signing people in through a real OpenID
// provider (zitadel/oidc's op) with users: alice.oidc (staff), nora (no
// group), and names that must not pass: ALICE@evil.example and ALICE
// (local alice's), NORA (nora's, another subject), root1 with braille
// blanks.
func oidcPortal(t *testing.T) (*portal, *testkit.OIDCProvider, *http.Client) {
	var prov *testkit.OIDCProvider
	p := newPortalWith(t, func(publicURL string, w *config.Web) *http.Client {
		prov = testkit.StartOIDC(t, "deskway-portal", "portal-secret", []string{publicURL + "/oidc/callback"}, []testkit.OIDCUser{
			{Username: "alice.oidc", Password: "Alice-OIDC-1", Groups: []string{"staff"}},
			{Username: "nora", Password: "Nora-OIDC-1"},
			{Username: "ALICE@evil.example", Password: "Mallory-1"},
			{Username: "ALICE", Password: "Mallory-2"},
			{Username: "NORA", Password: "Nora-Other-1"},
			{Username: "root1\u2800\u2800", Password: "Blank-1"},
		})
		w.OIDC = &config.OIDC{Issuer: prov.Issuer, ClientID: "deskway-portal", ClientSecret: config.NewSecret("portal-secret")}
		return prov.Client
	})
	// A browser: it trusts both servers and keeps cookies.
	roots := prov.Client.Transport.(*http.Transport).TLSClientConfig.RootCAs.Clone()
	roots.AddCert(p.srv.Certificate())
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	return p, prov, browser
}

var authRequestID = regexp.MustCompile(`name="id" value="([^"]+)"`)

// signInOIDC goes from the portal's button through the provider's login
// page and back, as a browser does, and returns the last page.
func signInOIDC(t *testing.T, p *portal, browser *http.Client, user, password string) (*http.Response, string) {
	t.Helper()
	resp, err := browser.Get(p.srv.URL + "/oidc/login")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := authRequestID.FindStringSubmatch(string(body))
	if m == nil {
		t.Fatalf("the provider's login page (%s) has no auth request id:\n%s", resp.Request.URL, body)
	}
	login := *resp.Request.URL
	login.Path, login.RawQuery = "/login/username", ""
	resp, err = browser.PostForm(login.String(), url.Values{"username": {user}, "password": {password}, "id": {m[1]}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func TestOIDCSignIn(t *testing.T) {
	p, prov, browser := oidcPortal(t)
	if body := read(p.do("GET", "/signin", nil, nil, nil)); !strings.Contains(body, `href="/oidc/login"`) || !strings.Contains(body, "Sign in with your organisation") {
		t.Fatalf("the sign-in page offers no provider:\n%s", body)
	}
	// A wrong password stays at the provider: no portal sign-in.
	resp, body := signInOIDC(t, p, browser, "alice.oidc", "wrong")
	if strings.HasPrefix(resp.Request.URL.String(), p.srv.URL) || !strings.Contains(body, "Login") {
		t.Fatalf("a wrong password at the provider ended at %s:\n%s", resp.Request.URL, body)
	}
	u, _ := url.Parse(p.srv.URL)
	for _, c := range browser.Jar.Cookies(u) {
		if c.Name == "__Host-deskway" {
			t.Fatal("a wrong password at the provider signed in to the portal")
		}
	}
	// The right one: back at the portal, signed in with the staff group.
	resp, body = signInOIDC(t, p, browser, "alice.oidc", "Alice-OIDC-1")
	if resp.Request.URL.String() != p.srv.URL+"/" || !strings.Contains(body, "Signed in as <strong>alice.oidc@127.0.0.1</strong>") || !strings.Contains(body, "<h2>desk</h2>") {
		t.Fatalf("after signing in at the provider: %s %s\n%s", resp.Status, resp.Request.URL, body)
	}
	// Sign-out goes on to the provider's logout.
	csrf := csrfField.FindStringSubmatch(body)[1]
	nf := &http.Client{Jar: browser.Jar, Transport: browser.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest("POST", p.srv.URL+"/signout", strings.NewReader(url.Values{"csrf": {csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	out, err := nf.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out.Body.Close()
	if loc := out.Header.Get("Location"); !strings.HasPrefix(loc, prov.Issuer+"/") || !strings.Contains(loc, "post_logout_redirect_uri="+url.QueryEscape(p.srv.URL+"/signin")) {
		t.Fatalf("sign-out of an OIDC sign-in goes to %q", loc)
	}
	// A provider user whose name is a local account's (any case, any
	// domain) is refused, not made that account.
	_, body = signInOIDC(t, p, browser, "ALICE", "Mallory-2")
	if !strings.Contains(body, "is the name of a local account") || strings.Contains(body, "<h2>desk</h2>") {
		t.Fatalf("a provider user named like local alice:\n%s", body)
	}
	// Names with a domain, or with characters that do not show, are not
	// taken.
	for _, u := range []struct{ name, pw string }{{"ALICE@evil.example", "Mallory-1"}, {"root1\u2800\u2800", "Blank-1"}} {
		_, body = signInOIDC(t, p, browser, u.name, u.pw)
		if !strings.Contains(body, "is not one this portal takes") || strings.Contains(body, "Signed in as") {
			t.Fatalf("provider user %q:\n%s", u.name, body)
		}
	}
	// A user in no group signs in and is told what to do.
	_, body = signInOIDC(t, p, browser, "nora", "Nora-OIDC-1")
	if !strings.Contains(body, "Signed in as <strong>nora@127.0.0.1</strong>") || !strings.Contains(body, "You may launch no desktop") {
		t.Fatalf("nora's page:\n%s", body)
	}
}

func TestOIDCCallbackChecksStateAndFlow(t *testing.T) {
	p, _, browser := oidcPortal(t)
	// A callback with no sign-in started in this browser.
	r := p.do("GET", "/oidc/callback?code=x&state=y", nil, nil, nil)
	if body := read(r); r.StatusCode != http.StatusBadRequest || !strings.Contains(body, "no sign-in in progress") {
		t.Fatalf("callback without a flow: %s\n%s", r.Status, body)
	}
	// A callback whose state is not the browser's (a login CSRF).
	resp, err := browser.Get(p.srv.URL + "/oidc/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = browser.Get(p.srv.URL + "/oidc/callback?code=attacker-code&state=attacker-state")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "not for this browser") {
		t.Fatalf("callback with another state: %s\n%s", resp.Status, body)
	}
	// The provider's refusal is shown by its code, not a sign-in; words
	// from the link are not put on the page.
	r = p.do("GET", "/oidc/callback?error=access_denied&error_description=Call+0800+FRAUD+now", nil, nil, nil)
	if body := read(r); r.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "access was denied") || strings.Contains(body, "FRAUD") {
		t.Fatalf("callback with an error: %s\n%s", r.Status, body)
	}
	r = p.do("GET", "/oidc/callback?error=Your+account+is+locked.+Call+0800", nil, nil, nil)
	if body := read(r); strings.Contains(body, "0800") {
		t.Fatalf("a made-up error code reached the page:\n%s", body)
	}
}

// TestOIDCNameIsItsFirstSubjects: a provider name is the first subject's
// that signed in with it: another subject with that name (a renamed or
// recycled account at the provider; here NORA, which the broker reads
// as nora) is refused, also after a restart, and told to have the
// operator map it.
func TestOIDCNameIsItsFirstSubjects(t *testing.T) {
	p, prov, browser := oidcPortal(t)
	_, body := signInOIDC(t, p, browser, "nora", "Nora-OIDC-1")
	if !strings.Contains(body, "Signed in as <strong>nora@127.0.0.1</strong>") {
		t.Fatalf("nora's page:\n%s", body)
	}
	other := func() string {
		roots := prov.Client.Transport.(*http.Transport).TLSClientConfig.RootCAs.Clone()
		roots.AddCert(p.srv.Certificate())
		jar, _ := cookiejar.New(nil)
		b := &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
		_, body := signInOIDC(t, p, b, "NORA", "Nora-Other-1")
		return body
	}
	for _, when := range []string{"", "after a restart"} {
		if when != "" {
			p.restart()
		}
		if body := other(); strings.Contains(body, "Signed in as") || !strings.Contains(body, "already belongs to another account") || !strings.Contains(body, "web.oidc.accounts") {
			t.Fatalf("another subject named NORA %s:\n%s", when, body)
		}
	}
}

// TestOIDCCallbackErrorIsThePortalsSentence: an error code made up to
// read as a message (any lower-case words joined by _) is not shown; the
// page says the portal's own sentence.
func TestOIDCCallbackErrorIsThePortalsSentence(t *testing.T) {
	p, _, _ := oidcPortal(t)
	text := "password_expired_call_helpdesk_now"
	body := read(p.do("GET", "/oidc/callback?error="+text, nil, nil, nil))
	if strings.Contains(body, text) || !strings.Contains(body, "The identity provider did not sign you in.") {
		t.Errorf("the sign-in page for error=%s:\n%s", text, body)
	}
	body = read(p.do("GET", "/oidc/callback?error=login_required", nil, nil, nil))
	if strings.Contains(body, "login_required") || !strings.Contains(body, "sign in or confirm there first") {
		t.Errorf("the sign-in page for error=login_required:\n%s", body)
	}
}

var sessionField = regexp.MustCompile(`name="session" value="([^"]+)"`)

// TestOIDCUserIsNotTheDirectoryUserOfTheSameName: a provider user named
// carol neither sees nor logs off the directory's carol's session; one
// whose subject web.oidc.accounts maps to carol does.
func TestOIDCUserIsNotTheDirectoryUserOfTheSameName(t *testing.T) {
	var prov *testkit.OIDCProvider
	p := newPortalWith(t, func(publicURL string, w *config.Web) *http.Client {
		dir := testkit.StartSlapd(t, []testkit.LDAPUser{{UID: "carol", Password: "Carol-LDAP-1", Groups: []string{"staff"}}},
			[]testkit.LDAPGroup{{CN: "staff"}})
		w.LDAP = &config.LDAP{URL: dir.URL, BindDN: dir.BindDN, BindPassword: config.NewSecret(dir.BindPW), BaseDN: dir.BaseDN}
		prov = testkit.StartOIDC(t, "deskway-portal", "portal-secret", []string{publicURL + "/oidc/callback"}, []testkit.OIDCUser{
			{Username: "carol", Password: "Carol-OIDC-1", Groups: []string{"staff"}},
			{Username: "carla", Password: "Carla-OIDC-1", Groups: []string{"staff"}},
		})
		// The test provider's subjects are usera, userb, ... in order:
		// carla (userb) is mapped to the directory's carol.
		w.OIDC = &config.OIDC{Issuer: prov.Issuer, ClientID: "deskway-portal", ClientSecret: config.NewSecret("portal-secret"),
			Accounts: map[string]string{"userb": "carol"}}
		return prov.Client
	})
	// The directory's carol launches desk, and h1 reports her session.
	ldapCarol := p.signIn("carol", "Carol-LDAP-1")
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, ldapCarol, nil)))[1]
	if r := p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, ldapCarol, nil); r.StatusCode != http.StatusOK {
		t.Fatalf("carol's launch: %s\n%s", r.Status, read(r))
	}
	if _, err := p.agent.Heartbeat(context.Background(), p.hostCred, brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9,
		Sessions: []brokerapi.Session{{User: "carol", State: "active"}}}); err != nil {
		t.Fatal(err)
	}
	m := sessionField.FindStringSubmatch(read(p.do("GET", "/", nil, ldapCarol, nil)))
	if m == nil {
		t.Fatal("the directory's carol has no session to log off")
	}
	session := m[1]
	newBrowser := func() *http.Client {
		roots := prov.Client.Transport.(*http.Transport).TLSClientConfig.RootCAs.Clone()
		roots.AddCert(p.srv.Certificate())
		jar, _ := cookiejar.New(nil)
		return &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	}
	// The provider's carol is carol@127.0.0.1: no session, and carol's is
	// not hers to log off.
	b := newBrowser()
	_, body := signInOIDC(t, p, b, "carol", "Carol-OIDC-1")
	if !strings.Contains(body, "Signed in as <strong>carol@127.0.0.1</strong>") || strings.Contains(body, session) || !strings.Contains(body, "Not running.") {
		t.Errorf("the provider's carol sees:\n%s", body)
	}
	logoff := func(b *http.Client, csrf string) *http.Response {
		req, _ := http.NewRequest("POST", p.srv.URL+"/logoff", strings.NewReader(url.Values{"csrf": {csrf}, "session": {session}, "delivery_group": {"desk"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		nf := &http.Client{Jar: b.Jar, Transport: b.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := nf.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if r := logoff(b, csrfField.FindStringSubmatch(body)[1]); r.StatusCode == http.StatusSeeOther {
		t.Fatalf("the provider's carol logged off the directory's carol's session: %s %s", r.Status, r.Header.Get("Location"))
	}
	if !strings.Contains(read(p.do("GET", "/", nil, ldapCarol, nil)), session) {
		t.Fatal("the directory's carol lost her session to the provider's carol")
	}
	// A cookie from before provider users were qualified, naming carol,
	// no longer passes.
	body2, _ := json.Marshal(map[string]any{"id": "0123456789abcdef", "u": "carol", "g": []string{"staff"},
		"iat": p.clock.now().Unix(), "seen": p.clock.now().Unix(), "via": "oidc"})
	enc := base64.RawURLEncoding.EncodeToString(body2)
	m2 := hmac.New(sha256.New, []byte("web-test-cookie-key-0123456789abcdef"))
	m2.Write([]byte("signin\x00" + enc + "\x00"))
	old := &http.Cookie{Name: "__Host-deskway", Value: enc + "." + base64.RawURLEncoding.EncodeToString(m2.Sum(nil))}
	if r := p.do("GET", "/", nil, old, nil); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/signin" {
		t.Fatalf("an unqualified provider sign-in of carol opens the page: %s\n%s", r.Status, read(r))
	}
	// carla, mapped to carol by the configuration, is carol.
	b = newBrowser()
	_, body = signInOIDC(t, p, b, "carla", "Carla-OIDC-1")
	if !strings.Contains(body, "Signed in as <strong>carol</strong>") || !strings.Contains(body, session) {
		t.Fatalf("carla, mapped to carol, sees:\n%s", body)
	}
	if r := logoff(b, csrfField.FindStringSubmatch(body)[1]); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("carla, mapped to carol, could not log off carol's session: %s\n%s", r.Status, read(r))
	}
}

// TestDirectoryNameInTheProvidersNamespace: a directory entry named
// nora@127.0.0.1, the form the provider's nora takes, does not sign in
// as her.
func TestDirectoryNameInTheProvidersNamespace(t *testing.T) {
	p := newPortalWith(t, func(publicURL string, w *config.Web) *http.Client {
		dir := testkit.StartSlapd(t, []testkit.LDAPUser{{UID: "nora@127.0.0.1", Password: "Nora-LDAP-1"}, {UID: "lara", Password: "Lara-LDAP-1"}}, nil)
		w.LDAP = &config.LDAP{URL: dir.URL, BindDN: dir.BindDN, BindPassword: config.NewSecret(dir.BindPW), BaseDN: dir.BaseDN}
		prov := testkit.StartOIDC(t, "deskway-portal", "portal-secret", []string{publicURL + "/oidc/callback"}, []testkit.OIDCUser{
			{Username: "nora", Password: "Nora-OIDC-1"}})
		w.OIDC = &config.OIDC{Issuer: prov.Issuer, ClientID: "deskway-portal", ClientSecret: config.NewSecret("portal-secret")}
		return prov.Client
	})
	if r := p.do("POST", "/signin", url.Values{"user": {"nora@127.0.0.1"}, "password": {"Nora-LDAP-1"}}, nil, nil); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the directory's nora@127.0.0.1 signing in: %s", r.Status)
	}
	p.signIn("lara", "Lara-LDAP-1")
}
