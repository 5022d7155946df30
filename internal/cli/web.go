package cli

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/web"
)

// webCookieKeyFile keeps the portal's cookie key when the config names
// none, so sign-ins survive a restart.
const webCookieKeyFile = "web-cookie.key"

// portalLaunchRetries is how many times the portal tries a launch again
// when the broker asks it to wait (its launch cap reached, every host busy
// with logons) before showing the user the refusal.
const portalLaunchRetries = 3

// newWeb builds the portal from the config: its broker (this deskway's
// unless web.broker names another) and its cookie key, with users, which
// a reload replaces. A non-nil local is the broker of this process: the
// portal calls it without TLS or a socket.
func newWeb(cfg *config.Config, users *auth.Users, log *slog.Logger, reg prometheus.Registerer, local *broker.Local) (*web.Server, error) {
	w := cfg.Web
	roots, err := ownCAPool(cfg, w.BrokerCA, "web.broker_ca")
	if err != nil {
		return nil, err
	}
	key := []byte(w.CookieKey.Value())
	if !w.CookieKey.IsSet() {
		if key, err = stateKey(filepath.Join(cfg.StateDir, webCookieKeyFile)); err != nil {
			return nil, err
		}
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64}}
	var oc *http.Client
	if o := w.OIDC; o != nil && o.CA != "" {
		pem, err := os.ReadFile(o.CA)
		if err != nil {
			return nil, fmt.Errorf("web.oidc.ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("web.oidc.ca: %s holds no PEM certificate", o.CA)
		}
		oc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	}
	var admin *http.Client
	if cn := w.Console; cn != nil {
		pool := roots
		if cn.APICA != "" {
			pem, err := os.ReadFile(cn.APICA)
			if err != nil {
				return nil, fmt.Errorf("web.console.api_ca: %w", err)
			}
			pool = x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("web.console.api_ca: %s holds no PEM certificate", cn.APICA)
			}
		}
		admin = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	}
	var ltc *tls.Config
	if l := w.LDAP; l != nil && l.CA != "" {
		pem, err := os.ReadFile(l.CA)
		if err != nil {
			return nil, fmt.Errorf("web.ldap.ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("web.ldap.ca: %s holds no PEM certificate", l.CA)
		}
		ltc = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	var bc web.Broker = brokerclient.FrontEnd{Client: &brokerclient.Client{Base: w.Broker, HTTP: hc, MaxRetries: portalLaunchRetries},
		Token: w.FrontendToken.Value()}
	if local != nil {
		bc = local
		log.Info("the portal calls this process's broker directly", "role", "web")
	}
	return web.New(w, web.Deps{Logger: log.With("role", "web"), Registry: reg, Users: users,
		Throttle: auth.NewThrottle(cfg.Auth.MaxFailures, cfg.Auth.MaxFailuresPerAddress, cfg.Auth.FailureWindow.D(), nil),
		Broker:   bc, CookieKey: key,
		OIDCClient: oc, LDAPTLS: ltc, AdminAPI: admin, StateDir: cfg.StateDir})
}

// stateKey reads a 32-byte key from path, making it (0600) on first use.
func stateKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("web cookie key: %w", err)
	}
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("web cookie key: %w", err)
	}
	return b, nil
}
