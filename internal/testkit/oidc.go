package testkit

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// OIDCUser is an account of the test OpenID provider.
type OIDCUser struct {
	Username, Password string
	Groups             []string
}

// OIDCProvider is a running OpenID provider, built from zitadel/oidc's
// certified op package and its example storage and login page.
type OIDCProvider struct {
	Issuer string
	// Client trusts the provider's certificate.
	Client *http.Client
	// CAFile is the provider's certificate, PEM.
	CAFile string
}

// groupsStorage is the example storage with a groups claim: in the ID
// token when the "groups" scope is asked for, and at userinfo.
type groupsStorage struct {
	*storage.Storage
	groups map[string][]string // by user id
}

func (s *groupsStorage) SetUserinfoFromRequest(ctx context.Context, ui *oidc.UserInfo, req op.IDTokenRequest, scopes []string) error {
	if err := s.Storage.SetUserinfoFromRequest(ctx, ui, req, scopes); err != nil {
		return err
	}
	if slices.Contains(scopes, "groups") && s.groups[req.GetSubject()] != nil {
		ui.AppendClaims("groups", s.groups[req.GetSubject()])
	}
	return nil
}

func (s *groupsStorage) SetUserinfoFromToken(ctx context.Context, ui *oidc.UserInfo, tokenID, subject, origin string) error {
	if err := s.Storage.SetUserinfoFromToken(ctx, ui, tokenID, subject, origin); err != nil {
		return err
	}
	if s.groups[subject] != nil {
		ui.AppendClaims("groups", s.groups[subject])
	}
	return nil
}

// logoutClient is the example web client with post-logout redirect URIs,
// which the example's constructor cannot set.
type logoutClient struct {
	op.Client
	postLogout []string
}

func (c logoutClient) PostLogoutRedirectURIs() []string { return c.postLogout }

// GetClientByClientID gives the client its post-logout URIs: each
// redirect URI's origin + "/signin".
func (s *groupsStorage) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range c.RedirectURIs() {
		if u, err := url.Parse(r); err == nil {
			out = append(out, u.Scheme+"://"+u.Host+"/signin")
		}
	}
	return logoutClient{Client: c, postLogout: out}, nil
}

// StartOIDC starts an OpenID provider on loopback over TLS with one web
// client (clientID, secret, redirect URIs) and users; it stops at test end.
func StartOIDC(t testing.TB, clientID, secret string, redirects []string, users []OIDCUser) *OIDCProvider {
	t.Helper()
	return startOIDC(t, nil, clientID, secret, redirects, users)
}

// StartOIDCWithCert is StartOIDC serving cert, for a client that must
// find the certificate's issuer in its own trust roots.
func StartOIDCWithCert(t testing.TB, cert tls.Certificate, clientID, secret string, redirects []string, users []OIDCUser) *OIDCProvider {
	t.Helper()
	return startOIDC(t, &cert, clientID, secret, redirects, users)
}

func startOIDC(t testing.TB, cert *tls.Certificate, clientID, secret string, redirects []string, users []OIDCUser) *OIDCProvider {
	t.Helper()
	byID := map[string]*storage.User{}
	groups := map[string][]string{}
	for i, u := range users {
		id := "user" + string(rune('a'+i))
		byID[id] = &storage.User{ID: id, Username: u.Username, Password: u.Password, FirstName: u.Username, LastName: "Test",
			Email: u.Username + "@example.test", EmailVerified: true}
		groups[id] = u.Groups
	}
	dir := t.TempDir()
	b, _ := json.Marshal(byID)
	usersFile := filepath.Join(dir, "users.json")
	if err := os.WriteFile(usersFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	us, err := storage.StoreFromFile(usersFile)
	if err != nil {
		t.Fatal(err)
	}
	st := &groupsStorage{Storage: storage.NewStorageWithClients(us, map[string]*storage.Client{
		clientID: storage.WebClient(clientID, secret, redirects...)}), groups: groups}
	srv := httptest.NewUnstartedServer(nil)
	issuer := "https://" + srv.Listener.Addr().String()
	srv.Config.Handler = exampleop.SetupServer(issuer, st, nil, false)
	if cert != nil {
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, certPEM(srv.Certificate().Raw), 0o644); err != nil {
		t.Fatal(err)
	}
	return &OIDCProvider{Issuer: issuer, Client: srv.Client(), CAFile: ca}
}

func certPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
