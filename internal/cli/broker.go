package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/agent"
	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/obs"
)

func brokerCmd() *cobra.Command {
	return roleCmd("broker", "Run the session broker: places launches on session hosts and returns .rdp files through the gateway", true, func(cfg *config.Config) error {
		if cfg.Broker == nil {
			return errors.New("the config has no broker section: add broker.delivery_groups (name, users or groups)")
		}
		cfg.Gateway, cfg.Stream, cfg.Agent, cfg.Site = nil, nil, nil, nil
		return nil
	})
}

func agentCmd() *cobra.Command {
	var cfgPath string
	c := &cobra.Command{
		Use:   "agent",
		Short: "Run the session-host agent: registers this host with the broker and reports load, disk health and sessions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if cfg.Agent == nil {
				return errors.New("the config has no agent section: add agent.broker and agent.join_token")
			}
			log := obs.NewLogger(cmd.ErrOrStderr(), cfg.Log.Level, cfg.Log.Format).With("role", "agent")
			build := obs.ReadBuild(Version, Revision)
			log.Info("deskway starting", "version", build.Version, "revision", build.Revision, "go", build.GoVersion, "roles", []string{"agent"})
			a, err := newAgent(cfg.Agent, cfg.StateDir, log)
			if err != nil {
				return err
			}
			return a.Run(cmd.Context())
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file")
	return c
}

// newAgent builds the agent from its config section.
func newAgent(cfg *config.Agent, stateDir string, log *slog.Logger) (*agent.Agent, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.BrokerCA != "" {
		pem, err := os.ReadFile(cfg.BrokerCA)
		if err != nil {
			return nil, fmt.Errorf("agent.broker_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("agent.broker_ca: %s holds no PEM certificate", cfg.BrokerCA)
		}
		tc.RootCAs = pool
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}}
	var sessions func() ([]brokerapi.Session, error)
	var usage func() ([]agent.SessionUsage, error)
	var control agent.Controller
	if cfg.Sessions == "xrdp" {
		sessions = func() ([]brokerapi.Session, error) { return agent.XRDPSessions("/proc") }
		usage = func() ([]agent.SessionUsage, error) { return agent.ReadSessionUsage("/proc") }
		control = &agent.XRDP{}
	}
	return agent.New(cfg, agent.Deps{Logger: log, Client: &brokerclient.Client{Base: cfg.Broker, HTTP: hc}, Sessions: sessions,
		Usage: usage, Control: control, CredentialFile: filepath.Join(stateDir, agentCredentialFile),
		CheckRDP: func(ctx context.Context) error {
			return agent.CheckRDP(ctx, net.JoinHostPort(cfg.Address, strconv.Itoa(cfg.Port)))
		}})
}

// newBroker opens the broker's store and builds the role.
func newBroker(ctx context.Context, cfg *config.Config, log *slog.Logger, reg *prometheus.Registry) (*broker.Server, *store.Store, error) {
	// Start migrates; connecting first lets a broker start while the
	// database is down, from the local host cache it saved.
	st, err := store.Connect(cfg.Broker.Database.Value(), cfg.Broker.MaxDBConnections)
	if err != nil {
		return nil, nil, fmt.Errorf("broker.database: %w", err)
	}
	users, err := auth.NewUsers(cfg.Auth.Users)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	users.WithDesktops(cfg.Auth.DesktopAccounts)
	tokens, err := auth.NewTokens([]byte(cfg.Auth.TokenKey.Value()), cfg.Now)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	peerTLS, err := brokerPeerTLS(cfg)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	b, err := broker.New(cfg.Broker, broker.Deps{Logger: log.With("role", "broker"), Registry: reg, Users: users,
		Tokens: tokens, Store: st, Throttle: auth.NewThrottle(cfg.Auth.MaxFailures, cfg.Auth.MaxFailuresPerAddress, cfg.Auth.FailureWindow.D(), nil),
		StateDir: cfg.StateDir, PeerTLS: peerTLS})
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	if err := b.Start(ctx); err != nil {
		st.Close()
		return nil, nil, err
	}
	return b, st, nil
}

// brokerPeerTLS is how a broker checks its peers' certificates:
// against broker.peer_ca, or this deskway's own certificate, for
// broker.peer_server_name, or each peer URL's host.
func brokerPeerTLS(cfg *config.Config) (*tls.Config, error) {
	if len(cfg.Broker.Peers) == 0 {
		return nil, nil
	}
	pool, err := ownCAPool(cfg, cfg.Broker.PeerCA, "broker.peer_ca")
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: cfg.Broker.PeerServerName}, nil
}

func joinCmd() *cobra.Command {
	var (
		cfgPath, group, zone string
		ttl                  time.Duration
		uses                 int
	)
	c := &cobra.Command{
		Use:   "join",
		Short: "Mint a join token with which deskway agent registers a session host into a delivery group",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if group == "" {
				return errors.New("token join: --group is required")
			}
			tk, err := tokensFrom(cfgPath, "token join")
			if err != nil {
				return err
			}
			if uses < 0 {
				return errors.New("token join: --uses must be 0 (any number of hosts) or more")
			}
			s, err := tk.MintJoin(group, zone, ttl, uses)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), s)
			return nil
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file holding auth.token_key")
	c.Flags().StringVar(&group, "group", "", "delivery group the host joins")
	c.Flags().StringVar(&zone, "zone", "", "zone the host is in (else the agent's own setting)")
	c.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token can register new hosts")
	c.Flags().IntVar(&uses, "uses", 0, "how many new hosts it may register (0: any number within --ttl)")
	return c
}

func runCmd() *cobra.Command {
	var cfgPath string
	c := &cobra.Command{
		Use:   "run",
		Short: "Run every role the config file has a section for (gateway, broker, agent, stream, web, site)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			return runRoles(cmd.Context(), cfgPath, cfg, cmd.ErrOrStderr(), nil)
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file")
	return c
}

// ownCAPool loads the certificates in the file path, the value of the
// setting key (errors name it), or, when it is empty, this deskway's own
// certificate: tls.cert, else the one deskway made in its state
// directory. The portal's broker_ca and the broker's peer_ca both mean it.
func ownCAPool(cfg *config.Config, path, key string) (*x509.CertPool, error) {
	if path == "" {
		path = cfg.TLS.Cert
		if path == "" {
			path = filepath.Join(cfg.StateDir, "tls.crt") // the certificate deskway made
		}
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", key, path)
	}
	return pool, nil
}
