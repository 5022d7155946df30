package cli

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker"
	"github.com/deskway/deskway/internal/config"
)

// upConfigTemplate is what deskway up writes on first start: every role on
// this machine, a demo user, and policies that reach RDP hosts on loopback.
const upConfigTemplate = `# Written by "deskway up" on first start; edit freely, it is read on every start.
state_dir: %[1]s
log:
  level: info
admin:
  listen: %[5]s
  tokens: [%[2]s]
auth:
  token_key: %[3]s
  users:
  - name: demo
    password: %[4]s
    groups: [users]
  # The admin console's administrator (web console at /admin).
  - name: admin
    password: %[15]s
    groups: [admins]
  # The demo user's account on this machine (a Unix user deskway up
  # creates): the broker counts its xrdp session as demo's, and the
  # gateway logs demo's browser sessions on with it (single sign-on).
  desktop_accounts:
  - user: demo
    account: deskway-demo
    password: %[18]s
gateway:
  listen: "%[6]s"
  public_name: localhost:%[11]s
  # Pages that may open desktops in a browser tab: the portal's.
  browser_origins: ["https://localhost:%[16]s", "https://127.0.0.1:%[16]s"]
  connection_policies:
  - name: users
    groups: [users]
  resource_policies:
  - name: local-rdp
    groups: [users]
    hosts: [127.0.0.0/8, "::1"]
    ports: [%[19]d]
    # A browser cannot judge the host's certificate, so the gateway does:
%[17]s
broker:
  listen: "%[9]s"
  # The portal (web) launches on behalf of the users who sign in to it.
  frontend_tokens: [%[13]s]
  delivery_groups:
  - name: desktops
    description: this machine's RDP server
    groups: [users]
    # The demo user is a gateway account, not one of this machine's: the
    # .rdp file names its desktop account (auth.desktop_accounts) instead.
    host_username: none
  # This machine is the session host and runs everything else too, so
  # a busy moment (a build, a test run) is not a host too busy for users:
  # no CPU pressure or disk limits here. A dedicated session host keeps
  # the defaults.
  health:
    cpu_pressure_max_pct: 100
    disk_idle_min_pct: 0
    disk_latency_max_ms: 100000
agent:
  broker: https://localhost:%[12]s
  broker_ca: %[1]s/tls.crt
  join_token: %[10]s
  address: 127.0.0.1
  port: %[19]d
web:
  listen: "%[14]s"
  console:
    admins: [admins]
stream:
  listen: "%[7]s"
  vdisks:
  - name: demo
    base: %[8]s
    description: empty demo disk; put a real golden image here
`

// credentialsFile holds what deskway up generated that a person needs to
// sign in (the demo password, the admin token), mode 0600, so that none
// of it is printed to a terminal or its scrollback.
const credentialsFile = "credentials"

func upCmd() *cobra.Command {
	var stateDir, bind, listen, adminListen, streamListen, brokerListen, webListen string
	var public, host bool
	var rdpPort int
	c := &cobra.Command{
		Use:   "up",
		Short: "Run every role on this machine with embedded defaults and print where to connect",
		Long: `Runs every role with a config written on first start (STATE_DIR/up.yaml).
Listeners bind to loopback (--bind 127.0.0.1) unless --public binds them to
every interface. The demo password and the admin token are written to
STATE_DIR/credentials (mode 0600), never printed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			// Before the config: its first start pins xrdp's certificate.
			if host {
				if err := installHostPackages(cmd.Context(), out); err != nil {
					return err
				}
			}
			path := filepath.Join(stateDir, "up.yaml")
			if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
				if err := os.MkdirAll(stateDir, 0o700); err != nil {
					return fmt.Errorf("up: %w", err)
				}
				host := bind
				if public {
					host = ""
				}
				if host != "" && net.ParseIP(host) == nil {
					return fmt.Errorf("up: --bind %q is not an IP address", bind)
				}
				addrs := map[string]*string{"--listen": &listen, "--broker-listen": &brokerListen, "--stream-listen": &streamListen, "--web-listen": &webListen}
				for flag, a := range addrs {
					h, p, err := net.SplitHostPort(*a)
					if err != nil {
						return fmt.Errorf("up: %s %q must be :PORT or HOST:PORT", flag, *a)
					}
					if h == "" {
						h = host
					}
					*a = net.JoinHostPort(h, p)
				}
				if rdpPort < 1 || rdpPort > 65535 {
					return fmt.Errorf("up: --rdp-port %d is not a TCP port (1-65535)", rdpPort)
				}
				_, gport, _ := net.SplitHostPort(listen)
				_, bport, _ := net.SplitHostPort(brokerListen)
				_, wport, _ := net.SplitHostPort(webListen)
				demo := filepath.Join(stateDir, "vdisks", "demo.img")
				if err := makeSparse(demo, 256<<20); err != nil {
					return fmt.Errorf("up: demo vDisk: %w", err)
				}
				key := random(32)
				tk, err := auth.NewTokens([]byte(key), nil)
				if err != nil {
					return err
				}
				// The local agent's join token registers this one host, once,
				// within the hour; the agent then keeps its own credential.
				join, err := tk.MintJoin(upGroup, "", time.Hour, 1)
				if err != nil {
					return err
				}
				body := fmt.Sprintf(upConfigTemplate, stateDir, random(24), key, random(12), adminListen, listen, streamListen, demo,
					brokerListen, join, gport, bport, random(24), webListen, random(12), wport, xrdpPinLine("/etc/xrdp/cert.pem"), random(12), rdpPort)
				if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
					return fmt.Errorf("up: %w", err)
				}
			}
			cfg, err := config.Load(path)
			if err != nil {
				return err
			}
			if err := renewLocalAgent(cfg); err != nil {
				return err
			}
			creds := filepath.Join(stateDir, credentialsFile)
			if err := writeCredentials(creds, cfg); err != nil {
				return err
			}
			// xrdp, when deskway up started it, stops with the roles.
			hctx, stop := context.WithCancel(cmd.Context())
			wait := func() {}
			defer func() { stop(); wait() }()
			if host {
				if wait, err = sessionHost(hctx, out, cfg); err != nil {
					return err
				}
			}
			return runRoles(cmd.Context(), path, cfg, cmd.ErrOrStderr(), func(l listeners) {
				printUp(out, cfg, l, path, creds)
			})
		},
	}
	c.Flags().StringVar(&stateDir, "state-dir", "/var/lib/deskway", "where the generated config, keys and certificate live")
	c.Flags().StringVar(&bind, "bind", "127.0.0.1", "address the listeners bind to, written into the config on first start")
	c.Flags().IntVar(&rdpPort, "rdp-port", 3389, "this machine's RDP port, where the local agent and the gateway reach its desktops (and the demo's xrdp listens), written into the config on first start")
	c.Flags().BoolVar(&host, "session-host", true, "make this machine the demo's session host: install xrdp, twm and xterm if missing, create the deskway-demo account, start xrdp on loopback (needs root)")
	c.Flags().BoolVar(&public, "public", false, "bind to every interface instead of --bind (other machines can then connect)")
	c.Flags().StringVar(&listen, "listen", ":8443", "gateway port (or HOST:PORT), written into the config on first start")
	c.Flags().StringVar(&brokerListen, "broker-listen", ":8444", "broker port (or HOST:PORT), written into the config on first start")
	c.Flags().StringVar(&streamListen, "stream-listen", ":10809", "NBD port (or HOST:PORT) of the stream role, written into the config on first start")
	c.Flags().StringVar(&webListen, "web-listen", ":8446", "user portal port (or HOST:PORT), written into the config on first start")
	c.Flags().StringVar(&adminListen, "admin-listen", "127.0.0.1:9443", "admin listener, written into the config on first start")
	return c
}

// xrdpPinLine is the resource policy's pin of the local xrdp's
// certificate (cert, in PEM), or a comment saying how to pin one when
// there is none to read.
func xrdpPinLine(cert string) string {
	b, err := os.ReadFile(cert)
	if err == nil {
		if blk, _ := pem.Decode(b); blk != nil {
			if _, err := x509.ParseCertificate(blk.Bytes); err == nil {
				sum := sha256.Sum256(blk.Bytes)
				return fmt.Sprintf("    host_certificate_sha256: [%x]  # %s", sum, cert)
			}
		}
	}
	return "    # host_certificate_sha256: [SHA-256 of the host's certificate]  # no " + cert + " to read on first start"
}

// upGroup is the delivery group of the demo's own host.
const upGroup = "desktops"

// agentCredentialFile is where an agent keeps its host's credential, in
// its state directory.
const agentCredentialFile = "agent-credential"

// renewLocalAgent keeps the demo's own host registered however long the
// demo was stopped: its credential, which lapses after a week without a
// heartbeat, is minted again from the config's key, and a first start that
// never registered gets a fresh join token (the config's lasts an hour).
func renewLocalAgent(cfg *config.Config) error {
	if cfg.Agent == nil || !cfg.Auth.TokenKey.IsSet() {
		return nil
	}
	tk, err := auth.NewTokens([]byte(cfg.Auth.TokenKey.Value()), nil)
	if err != nil {
		return err
	}
	path := filepath.Join(cfg.StateDir, agentCredentialFile)
	old, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		join, err := tk.MintJoin(upGroup, "", time.Hour, 1)
		if err != nil {
			return err
		}
		cfg.Agent.JoinToken = config.NewSecret(join)
		return nil
	}
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	cred, err := tk.RenewAgent(strings.TrimSpace(string(old)), broker.AgentCredentialTTL)
	if err != nil {
		return fmt.Errorf("up: the local agent's credential in %s is not one this config's auth.token_key signed (was the key changed?): delete the file and remove the host (deskway host remove) to register it again: %w", path, err)
	}
	if err := os.WriteFile(path+".new", []byte(cred+"\n"), 0o600); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	return os.Rename(path+".new", path)
}

// writeCredentials writes the demo password and the admin token to path,
// mode 0600, from the config (which may have been edited since).
func writeCredentials(path string, cfg *config.Config) error {
	var b strings.Builder
	b.WriteString("# Written by deskway up from its config at every start.\n")
	for _, u := range cfg.Auth.Users {
		if u.Password.IsSet() {
			fmt.Fprintf(&b, "%s password: %s\n", u.Name, u.Password.Value())
		}
	}
	for _, d := range cfg.Auth.DesktopAccounts {
		fmt.Fprintf(&b, "%s password: %s\n", d.Account, d.Password.Value())
	}
	if len(cfg.Admin.Tokens) > 0 {
		fmt.Fprintf(&b, "admin token: %s\n", cfg.Admin.Tokens[0].Value())
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	return nil
}

// printUp says where to connect, naming the credentials file for secrets.
func printUp(out io.Writer, cfg *config.Config, l listeners, path, creds string) {
	port := func(a net.Addr, dflt string) string {
		if a == nil {
			return dflt
		}
		_, p, _ := net.SplitHostPort(a.String())
		return p
	}
	gport := port(l.Gateway, "8443")
	pw := fmt.Sprintf(`"$(sed -n 's/^demo password: //p' %s)"`, creds)
	hostPW := fmt.Sprintf(`"$(sed -n 's/^%s password: //p' %s)"`, demoAccount, creds)
	fmt.Fprintf(out, `deskway is up (config: %[1]s)
  credentials  %[2]s  (the demo, %[6]s and admin users' passwords and the admin token, mode 0600)
  gateway      https://localhost:%[3]s  (RD Gateway: MS-TSGU over websocket and RDG_IN/OUT_DATA)
  admin API    https://%[4]s/api/v1/gateway/tunnels  (Authorization: Bearer <admin token>)
  metrics      https://%[4]s/metrics
Connect through the gateway to this machine's RDP server as the demo's desktop account, %[6]s:
  xfreerdp /v:127.0.0.1 /u:%[6]s /p:%[7]s /g:localhost:%[3]s /gu:demo /gp:%[5]s /gt:http /cert:ignore
`, path, creds, gport, l.Admin, pw, demoAccount, hostPW)
	if l.Web != nil {
		fmt.Fprintf(out, `  portal       https://localhost:%[1]s  (sign in as demo and press Open in browser: the desktop opens in the tab, logged on as %[2]s; or Launch, and open the downloaded file: xfreerdp desktops.rdp /p:%[3]s /cert:ignore)
  console      https://localhost:%[1]s/admin/  (sign in as admin)
`, port(l.Web, "8446"), demoAccount, hostPW)
	}
	if l.Broker != nil {
		fmt.Fprintf(out, `A desktop from the broker, as an .rdp file, opened with xfreerdp:
  curl -sk -u demo:%[2]s -H 'Accept: application/x-rdp' -H 'Content-Type: application/json' -d '{"delivery_group":"desktops"}' https://localhost:%[1]s/api/v1/launch > desk.rdp
  xfreerdp desk.rdp /p:%[4]s /cert:ignore
  hosts        https://%[3]s/api/v1/broker/hosts
`, port(l.Broker, "8444"), pw, l.Admin, hostPW)
	}
	if l.Stream != nil && cfg.Stream != nil && len(cfg.Stream.VDisks) > 0 {
		fmt.Fprintf(out, `  stream       nbd://localhost:%[1]s/%[2]s/CLIENT/BOOT  (vDisks over NBD with a client certificate: ./bin/deskway stream cert issue -c %[3]s --client CLIENT)
  catalog      https://%[4]s/api/v1/stream/vdisks
`, port(l.Stream, "10809"), cfg.Stream.VDisks[0].Name, path, l.Admin)
	}
}

// makeSparse creates a sparse file of size bytes unless path exists.
func makeSparse(path string, size int64) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
