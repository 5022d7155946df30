package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/pki"
)

func streamCertCmd() *cobra.Command {
	c := &cobra.Command{Use: "cert", Short: "Client certificates of the stream role (stream.clients: certificate)"}
	var cfgPath, client, out, serverCA string
	var roles []string
	var days int
	issue := &cobra.Command{
		Use:   "issue --client NAME",
		Short: "Issue a client certificate from deskway's CA, as the files qemu, libnbd and nbd-client read",
		Long: `Writes ca-cert.pem (what the client trusts the server by), client-cert.pem
and client-key.pem into --out, the layout of qemu's tls-creds-x509 (dir=) and
libnbd's tls-certificates=. The certificate names the client: it opens that
client's boots and private image only, and the base read-only; --role
maintenance lets it open VDISK@maintenance.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if client == "" {
				return errors.New("stream cert issue: --client NAME is required (the name the client uses in its export names)")
			}
			for _, r := range roles {
				if r != pki.RoleMaintenance {
					return fmt.Errorf("stream cert issue: unknown role %q (the only role is %s)", r, pki.RoleMaintenance)
				}
			}
			ca, err := pki.LoadOrCreate(filepath.Join(cfg.StateDir, "ca"))
			if err != nil {
				return err
			}
			// Without tls.cert the stream role shows a certificate from
			// deskway's CA; with one, the client needs that one's CA.
			trust := ca.PEM
			if serverCA == "" && cfg.TLS.Cert != "" {
				return errors.New("stream cert issue: tls.cert is set, so give --server-ca: the CA certificate that issued it, which clients verify the server by")
			}
			if serverCA != "" {
				if trust, err = os.ReadFile(serverCA); err != nil {
					return fmt.Errorf("stream cert issue: --server-ca: %w", err)
				}
			}
			certPEM, keyPEM, err := ca.Issue(client, roles, time.Duration(days)*24*time.Hour)
			if err != nil {
				return err
			}
			if out == "" {
				out = client + "-tls"
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return err
			}
			for _, f := range []struct {
				name string
				b    []byte
				mode os.FileMode
			}{{"ca-cert.pem", trust, 0o644}, {"client-cert.pem", certPEM, 0o644}, {"client-key.pem", keyPEM, 0o600}} {
				if err := os.WriteFile(filepath.Join(out, f.name), f.b, f.mode); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/{ca-cert.pem,client-cert.pem,client-key.pem} for client %s, valid %d days\n", out, client, days)
			return nil
		},
	}
	issue.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file (for state_dir, where deskway's CA is kept)")
	issue.Flags().StringVar(&client, "client", "", "the client's name")
	issue.Flags().StringSliceVar(&roles, "role", nil, "roles: maintenance")
	issue.Flags().StringVar(&out, "out", "", "directory to write (default NAME-tls)")
	issue.Flags().StringVar(&serverCA, "server-ca", "", "CA certificate clients verify the server by (default: deskway's CA, which issues the server's certificate unless tls.cert is set)")
	issue.Flags().IntVar(&days, "days", 365, "validity in days")
	c.AddCommand(issue)
	return c
}
