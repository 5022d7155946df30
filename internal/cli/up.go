package cli

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/auth"
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
gateway:
  listen: "%[6]s"
  public_name: localhost%[6]s
  connection_policies:
  - name: users
    groups: [users]
  resource_policies:
  - name: local-rdp
    groups: [users]
    hosts: [127.0.0.0/8, "::1"]
    ports: [3389]
broker:
  listen: "%[9]s"
  delivery_groups:
  - name: desktops
    description: this machine's RDP server
    groups: [users]
agent:
  broker: https://localhost%[9]s
  broker_ca: %[1]s/tls.crt
  join_token: %[10]s
  address: 127.0.0.1
  port: 3389
stream:
  listen: "%[7]s"
  vdisks:
  - name: demo
    base: %[8]s
    description: empty demo disk; put a real golden image here
`

func upCmd() *cobra.Command {
	var stateDir, listen, adminListen, streamListen, brokerListen string
	c := &cobra.Command{
		Use:   "up",
		Short: "Run every role on this machine with embedded defaults and print where to connect",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := filepath.Join(stateDir, "up.yaml")
			if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
				if err := os.MkdirAll(stateDir, 0o700); err != nil {
					return fmt.Errorf("up: %w", err)
				}
				if _, _, err := net.SplitHostPort(listen); err != nil || !strings.HasPrefix(listen, ":") {
					return fmt.Errorf("up: --listen %q must be :PORT", listen)
				}
				if _, _, err := net.SplitHostPort(brokerListen); err != nil || !strings.HasPrefix(brokerListen, ":") {
					return fmt.Errorf("up: --broker-listen %q must be :PORT", brokerListen)
				}
				if _, _, err := net.SplitHostPort(streamListen); err != nil {
					return fmt.Errorf("up: --stream-listen %q must be host:port", streamListen)
				}
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
				join, err := tk.MintJoin("desktops", "", time.Hour, 1)
				if err != nil {
					return err
				}
				body := fmt.Sprintf(upConfigTemplate, stateDir, random(24), key, random(12), adminListen, listen, streamListen, demo, brokerListen, join)
				if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
					return fmt.Errorf("up: %w", err)
				}
			}
			cfg, err := config.Load(path)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			return runRoles(cmd.Context(), cfg, cmd.ErrOrStderr(), func(l listeners) {
				admin := l.Admin
				gport := "8443"
				if l.Gateway != nil {
					_, gport, _ = net.SplitHostPort(l.Gateway.String())
				}
				pw := ""
				if len(cfg.Auth.Users) > 0 {
					pw = cfg.Auth.Users[0].Password.Value()
				}
				fmt.Fprintf(out, `deskway is up (config: %s)
  gateway    https://localhost:%s  (RD Gateway: MS-TSGU over websocket and RDG_IN/OUT_DATA)
  admin API  https://%s/api/v1/gateway/tunnels  (Authorization: Bearer %s)
  metrics    https://%s/metrics
  user       demo / %s
Connect through it to an RDP host on this machine:
  xfreerdp /v:127.0.0.1 /g:localhost:%s /gu:demo /gp:'%s' /gt:http /cert:ignore
`, path, gport, admin, cfg.Admin.Tokens[0].Value(), admin, pw, gport, pw)
				if l.Broker != nil {
					_, bport, _ := net.SplitHostPort(l.Broker.String())
					fmt.Fprintf(out, `  broker     https://localhost:%[1]s/api/v1/launch  (a desktop from delivery group desktops, as an .rdp file:)
             curl -sk -u demo:'%[2]s' -H 'Accept: application/x-rdp' -H 'Content-Type: application/json' -d '{"delivery_group":"desktops"}' https://localhost:%[1]s/api/v1/launch > desk.rdp && xfreerdp desk.rdp /cert:ignore
  hosts      https://%[3]s/api/v1/broker/hosts
`, bport, pw, admin)
				}
				if l.Stream != nil && cfg.Stream != nil && len(cfg.Stream.VDisks) > 0 {
					_, sport, _ := net.SplitHostPort(l.Stream.String())
					fmt.Fprintf(out, `  stream     nbd://localhost:%[1]s/%[2]s  (vDisks over NBD; a client boots nbd://localhost:%[1]s/%[2]s/CLIENT/BOOT)
  catalog    https://%[3]s/api/v1/stream/vdisks
`, sport, cfg.Stream.VDisks[0].Name, admin)
				}
			})
		},
	}
	c.Flags().StringVar(&stateDir, "state-dir", "/var/lib/deskway", "where the generated config, keys and certificate live")
	c.Flags().StringVar(&listen, "listen", ":8443", "gateway port, written into the config on first start")
	c.Flags().StringVar(&brokerListen, "broker-listen", ":8444", "broker port, written into the config on first start")
	c.Flags().StringVar(&streamListen, "stream-listen", ":10809", "NBD listener of the stream role, written into the config on first start")
	c.Flags().StringVar(&adminListen, "admin-listen", "127.0.0.1:9443", "admin listener, written into the config on first start")
	return c
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
