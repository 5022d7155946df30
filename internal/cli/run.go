package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
	"github.com/deskway/deskway/internal/obs"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/tlsconf"
)

// runRoles starts every role cfg enables plus the admin listener, and
// returns when ctx ends and all have shut down, or when one fails to start.
func runRoles(ctx context.Context, cfg *config.Config, stderr io.Writer, ready func(gw, admin net.Addr)) error {
	log := obs.NewLogger(stderr, cfg.Log.Level, cfg.Log.Format)
	if cfg.Gateway == nil {
		return errors.New("no role is enabled: add a gateway section to the config (or use deskway up)")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	var hosts []string
	if h, _, err := net.SplitHostPort(cfg.Gateway.PublicName); err == nil {
		hosts = append(hosts, h)
	} else if cfg.Gateway.PublicName != "" {
		hosts = append(hosts, cfg.Gateway.PublicName)
	}
	tc, err := tlsconf.Load(cfg.TLS.Cert, cfg.TLS.Key, cfg.StateDir, hosts)
	if err != nil {
		return err
	}
	reg := obs.NewRegistry()
	users, err := auth.NewUsers(cfg.Auth.Users)
	if err != nil {
		return err
	}
	var tokens *auth.Tokens
	if cfg.Auth.TokenKey.IsSet() {
		if tokens, err = auth.NewTokens([]byte(cfg.Auth.TokenKey.Value()), nil); err != nil {
			return err
		}
	}
	pol, err := policy.New(cfg.Gateway, nil)
	if err != nil {
		return err
	}
	var central gateway.Authorizer
	if cfg.Gateway.RADIUS != nil {
		central = policy.NewRADIUS(cfg.Gateway.RADIUS)
	}
	gw, err := gateway.New(cfg.Gateway, gateway.Deps{
		Authorizer: central,
		Logger:     log.With("role", "gateway"),
		Registry:   reg,
		Users:      users,
		Tokens:     tokens,
		Policy:     pol,
		Throttle:   auth.NewThrottle(cfg.Auth.MaxFailures, cfg.Auth.FailureWindow.D(), nil),
		Domain:     cfg.Auth.Domain,
	})
	if err != nil {
		return err
	}
	gln, err := net.Listen("tcp", cfg.Gateway.Listen)
	if err != nil {
		return fmt.Errorf("gateway: listen on %s (gateway.listen): %w", cfg.Gateway.Listen, err)
	}
	aln, err := net.Listen("tcp", cfg.Admin.Listen)
	if err != nil {
		gln.Close()
		return fmt.Errorf("admin: listen on %s (admin.listen): %w", cfg.Admin.Listen, err)
	}
	var adminTokens []string
	for _, t := range cfg.Admin.Tokens {
		adminTokens = append(adminTokens, t.Value())
	}
	admin := &obs.Admin{Log: log.With("role", "admin"), Registry: reg, Tokens: adminTokens, API: []http.Handler{gw.AdminHandler()}}
	if ready != nil {
		ready(gln.Addr(), aln.Addr())
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(2)
	go func() { defer wg.Done(); errs[0] = gw.Serve(rctx, gln, tc); cancel() }()
	go func() { defer wg.Done(); errs[1] = admin.Serve(rctx, aln, tc); cancel() }()
	wg.Wait()
	log.Info("stopped")
	return errors.Join(errs...)
}
