package cli

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
	"github.com/deskway/deskway/internal/netboot"
	"github.com/deskway/deskway/internal/obs"
	"github.com/deskway/deskway/internal/pki"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/site"
	"github.com/deskway/deskway/internal/stream"
	"github.com/deskway/deskway/internal/tlsconf"
)

// listeners are the addresses each started role listens on, for the
// banner deskway up prints.
type listeners struct {
	Gateway, Stream, Broker, Admin, Web net.Addr
}

// runRoles starts every role cfg (read from path) enables plus the admin
// listener, and returns when ctx ends and all have shut down, or when one
// fails to start. SIGHUP and POST /api/v1/reload re-read path.
func runRoles(ctx context.Context, path string, cfg *config.Config, stderr io.Writer, ready func(listeners)) error {
	log := obs.NewLogger(stderr, cfg.Log.Level, cfg.Log.Format)
	rl := &reloader{path: path, log: log, running: cfg}
	// SIGHUP is taken from here on: its default ends the process, and the
	// roles listen one by one before they serve (a reload asked for as
	// soon as a port answers, as a unit's ExecReload may, killed it).
	// One that arrives meanwhile is applied once every role serves.
	hup, stopHUP := rl.watchSIGHUP()
	defer stopHUP()
	// cfg may hold fewer roles than the file (deskway gateway): which
	// sections the file itself has tells an added role from another's.
	rl.fileGateway, rl.fileBroker = cfg.Gateway != nil, cfg.Broker != nil
	if f, err := config.Load(path); err == nil {
		rl.fileGateway, rl.fileBroker = f.Gateway != nil, f.Broker != nil
	}
	var audit obs.AuditLog // in memory unless a broker's database keeps it
	if cfg.Gateway == nil && cfg.Stream == nil && cfg.Broker == nil && cfg.Web == nil && cfg.Site == nil {
		return errors.New("no role is enabled: add a gateway, broker, stream, web or site section to the config (or use deskway up)")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	var hosts []string
	if cfg.Gateway != nil {
		if h, _, err := net.SplitHostPort(cfg.Gateway.PublicName); err == nil {
			hosts = append(hosts, h)
		} else if cfg.Gateway.PublicName != "" {
			hosts = append(hosts, cfg.Gateway.PublicName)
		}
	}
	tc, err := tlsconf.Load(cfg.TLS.Cert, cfg.TLS.Key, cfg.StateDir, hosts)
	if err != nil {
		return err
	}
	build := obs.ReadBuild(Version, Revision)
	log.Info("deskway starting", "version", build.Version, "revision", build.Revision, "go", build.GoVersion, "roles", roleNames(cfg))
	reg := obs.NewRegistry(build)
	var (
		lns   listeners
		serve []func(context.Context) error
		api   []*http.ServeMux
	)
	closeAll := func() {}
	defer func() { closeAll() }()
	listen := func(key, addr string) (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen on %s (%s): %w", addr, key, err)
		}
		prev := closeAll
		closeAll = func() { prev(); ln.Close() }
		return ln, nil
	}
	if cfg.Gateway != nil {
		gw, err := newGateway(ctx, cfg, log, reg)
		if err != nil {
			return err
		}
		rl.gateway = gw
		gln, err := listen("gateway.listen", cfg.Gateway.Listen)
		if err != nil {
			return err
		}
		lns.Gateway = gln.Addr()
		serve = append(serve, func(ctx context.Context) error { return gw.Serve(ctx, gln, tc) })
		api = append(api, gw.AdminHandler())
	}
	if cfg.Stream != nil {
		sd := stream.Deps{Logger: log.With("role", "stream"), Registry: reg, TLS: tc}
		if cfg.Stream.Clients == "certificate" {
			caDir := filepath.Join(cfg.StateDir, "ca")
			ca, err := pki.LoadOrCreate(caDir)
			if err != nil {
				return err
			}
			sd.ClientCAs = ca.Pool()
			if cfg.TLS.Cert == "" {
				// Clients trust deskway's CA (the ca-cert.pem that
				// stream cert issue writes), so the server shows a
				// certificate the CA issued.
				sc, err := ca.ServerCert(caDir, hosts)
				if err != nil {
					return err
				}
				sd.TLS = &tls.Config{Certificates: []tls.Certificate{sc}, MinVersion: tls.VersionTLS12}
			}
		}
		st, err := stream.New(cfg.Stream, sd)
		if err != nil {
			return err
		}
		sln, err := listen("stream.listen", cfg.Stream.Listen)
		if err != nil {
			return err
		}
		lns.Stream = sln.Addr()
		serve = append(serve, func(ctx context.Context) error { return st.Serve(ctx, sln) })
		if cfg.Stream.SharedCache {
			// The boot services of every server sharing the store send
			// each boot to the least-loaded server first.
			serve = append(serve, func(ctx context.Context) error {
				return netboot.ReportLoad(ctx, log.With("role", "stream"), cfg.Stream.Store, sln.Addr(), func() int {
					n := 0
					for _, b := range st.Boots() {
						if b.Connections > 0 {
							n++
						}
					}
					return n
				})
			})
		}
		api = append(api, st.AdminHandler())
		if cfg.Stream.Netboot != nil {
			_, port, _ := net.SplitHostPort(sln.Addr().String())
			nb, err := netboot.New(cfg.Stream, netboot.Deps{Logger: log.With("role", "netboot"), Registry: reg, StateDir: cfg.StateDir, StreamPort: port,
				Live: func() []netboot.LiveBoot {
					var out []netboot.LiveBoot
					for _, b := range st.Boots() {
						out = append(out, netboot.LiveBoot{Client: b.Client, Running: netboot.Running{VDisk: b.VDisk, Version: b.Version, Stage: b.Stage, Boot: b.Boot}})
					}
					return out
				}})
			if err != nil {
				return err
			}
			st.SetAssigned(nb.Assigned)
			serve = append(serve, nb.Run)
			api = append(api, nb.AdminHandler())
		}
	}
	if cfg.Broker != nil {
		b, st, err := newBroker(ctx, cfg, log, reg)
		if err != nil {
			return err
		}
		defer st.Close()
		rl.broker = b
		audit = &storeAudit{st: st}
		bln, err := listen("broker.listen", cfg.Broker.Listen)
		if err != nil {
			return err
		}
		lns.Broker = bln.Addr()
		serve = append(serve, func(ctx context.Context) error { return b.Serve(ctx, bln, tc) })
		api = append(api, b.AdminHandler())
	}
	if cfg.Site != nil {
		if audit == nil {
			audit = &obs.MemoryAudit{Max: 10000}
		}
		st, err := site.New(cfg.Site, site.Deps{Logger: log.With("role", "site"), Registry: reg, Audit: audit})
		if err != nil {
			return err
		}
		rl.site = st
		serve = append(serve, st.Run)
		api = append(api, st.AdminHandler())
	}
	var consoleTokens []string
	for _, t := range cfg.Admin.ConsoleTokens {
		consoleTokens = append(consoleTokens, t.Value())
	}
	if cfg.Web != nil && cfg.Web.Console != nil && !cfg.Web.Console.Token.IsSet() && cfg.Web.Console.LocalAPI() {
		cn := cfg.Web.Console
		// The console of this process needs a credential only this
		// process's admin API takes: one made for this run.
		t := rand.Text()
		cn.Token = config.NewSecret(t)
		consoleTokens = append(consoleTokens, t)
	}
	if cfg.Web != nil {
		var local *broker.Local
		if cfg.Web.LocalBroker() && rl.broker != nil {
			local = rl.broker.Local(portalLaunchRetries)
		}
		users, err := auth.NewUsers(cfg.Auth.Users)
		if err != nil {
			return err
		}
		rl.portal = users
		wb, err := newWeb(cfg, users, log, reg, local)
		if err != nil {
			return err
		}
		wln, err := listen("web.listen", cfg.Web.Listen)
		if err != nil {
			return err
		}
		lns.Web = wln.Addr()
		serve = append(serve, func(ctx context.Context) error { return wb.Serve(ctx, wln, tc) })
	}
	if cfg.Agent != nil {
		a, err := newAgent(cfg.Agent, cfg.StateDir, log.With("role", "agent"))
		if err != nil {
			return err
		}
		// The agent's end is not the process's: it stops with the others.
		serve = append(serve, func(ctx context.Context) error {
			if err := a.Run(ctx); err != nil {
				log.Error("agent stopped", "error", err)
			}
			<-ctx.Done()
			return nil
		})
	}
	aln, err := listen("admin.listen", cfg.Admin.Listen)
	if err != nil {
		return err
	}
	lns.Admin = aln.Addr()
	var adminTokens []string
	for _, t := range cfg.Admin.Tokens {
		adminTokens = append(adminTokens, t.Value())
	}
	rl.audit = audit
	api = append(api, rl.adminHandler())
	admin := &obs.Admin{Log: log.With("role", "admin"), Registry: reg, Tokens: adminTokens, ConsoleTokens: consoleTokens, API: api, Audit: audit,
		Throttle: auth.NewThrottle(cfg.Auth.MaxFailures, cfg.Auth.MaxFailuresPerAddress, cfg.Auth.FailureWindow.D(), nil)}
	serve = append(serve, func(ctx context.Context) error { return admin.Serve(ctx, aln, tc) })
	closeAll = func() {} // the servers own their listeners from here
	serve = append(serve, hup)
	if ready != nil {
		ready(lns)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(serve))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, run := range serve {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = run(rctx); cancel() }()
	}
	wg.Wait()
	log.Info("stopped")
	return errors.Join(errs...)
}

// roleNames lists the roles cfg runs in this process, for the start line.
func roleNames(cfg *config.Config) []string {
	var r []string
	for _, x := range []struct {
		on   bool
		name string
	}{{cfg.Gateway != nil, "gateway"}, {cfg.Broker != nil, "broker"}, {cfg.Stream != nil, "stream"}, {cfg.Web != nil, "web"}, {cfg.Agent != nil, "agent"}, {cfg.Site != nil, "site"}} {
		if x.on {
			r = append(r, x.name)
		}
	}
	return r
}

// newGateway builds the gateway role from the config.
func newGateway(ctx context.Context, cfg *config.Config, log *slog.Logger, reg *prometheus.Registry) (*gateway.Server, error) {
	users, err := auth.NewUsers(cfg.Auth.Users)
	if err != nil {
		return nil, err
	}
	users.WithDesktops(cfg.Auth.DesktopAccounts)
	var tokens *auth.Tokens
	if cfg.Auth.TokenKey.IsSet() {
		if tokens, err = auth.NewTokens([]byte(cfg.Auth.TokenKey.Value()), cfg.Now); err != nil {
			return nil, err
		}
	}
	pol, err := policy.New(cfg.Gateway, nil)
	if err != nil {
		return nil, err
	}
	var central gateway.Authorizer
	if cfg.Gateway.RADIUS != nil {
		central = policy.NewRADIUS(cfg.Gateway.RADIUS)
	}
	var farmKey []byte
	if len(cfg.Gateway.FarmPeers) > 0 {
		farmKey = gateway.FarmKey([]byte(cfg.Auth.TokenKey.Value()))
	}
	var uses gateway.TokenUses
	var farmDB string
	if cfg.Farm != nil {
		farmDB = cfg.Farm.Database.Value()
		maxUses := 1
		if cfg.Gateway.TokenMaxUses != nil {
			maxUses = *cfg.Gateway.TokenMaxUses
		}
		if uses, err = gateway.NewFarmTokenUses(ctx, cfg.Farm.Database.Value(), maxUses, cfg.Gateway.ReconnectWindowD(), log.With("role", "gateway"), reg); err != nil {
			return nil, err
		}
	}
	return gateway.New(cfg.Gateway, gateway.Deps{
		TokenUses:    uses,
		FarmDatabase: farmDB,
		Authorizer:   central,
		Logger:       log.With("role", "gateway"),
		Registry:     reg,
		Users:        users,
		Tokens:       tokens,
		Policy:       pol,
		Throttle:     auth.NewThrottle(cfg.Auth.MaxFailures, cfg.Auth.MaxFailuresPerAddress, cfg.Auth.FailureWindow.D(), nil),
		Domain:       cfg.Auth.Domain,
		FarmKey:      farmKey,
	})
}
