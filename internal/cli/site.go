package cli

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/site"
	"github.com/deskway/deskway/internal/site/ha"
)

func siteCmd() *cobra.Command {
	c := roleCmd("site", "Run the site gateway: tenants' offices reach their hosted networks through GRE tunnels, each tenant in a network namespace of its own", false, func(cfg *config.Config) error {
		if cfg.Site == nil {
			return errors.New("the config has no site section: add site.underlay.addresses and site.tenants")
		}
		// Only this role runs, whatever else the file configures.
		cfg.Gateway, cfg.Broker, cfg.Web, cfg.Agent, cfg.Stream = nil, nil, nil, nil, nil
		return nil
	})
	c.AddCommand(siteTunnelsCmd())
	return c
}

func siteTunnelsCmd() *cobra.Command {
	var cfgPath string
	c := &cobra.Command{
		Use:   "tunnels",
		Short: "List each tenant's tunnels with their state and counters (through the admin API)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if cfg.Site == nil {
				return fmt.Errorf("%s has no site section, so the deskway it configures runs no site gateway to ask", cfgPath)
			}
			a, err := newAdminClient(cfgPath)
			if err != nil {
				return err
			}
			var out struct {
				Tenants []site.TenantStatus
				HA      *ha.Status
			}
			if err := a.call(cmd.Context(), "GET", "/api/v1/site/tunnels", nil, &out); err != nil {
				return err
			}
			if h := out.HA; h != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s of pair %s since %s (active: %s)\n", h.Node, h.Role, h.Group, h.Since.Format(time.RFC3339), cmp.Or(h.Holder, "none"))
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TENANT\tKEY\tSITE\tPEER\tSTATE\tPACKETS IN\tBYTES IN\tPACKETS OUT\tBYTES OUT\tDATAPATH")
			var drops []string
			for _, t := range out.Tenants {
				for _, s := range t.Sites {
					if s.Kind == "wireguard" {
						// WireGuard counts bytes, not packets; an office
						// with no endpoint configured calls in.
						peer := "wireguard"
						if s.Peer != "" {
							peer += " " + s.Peer
						}
						fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t-\t%d\t-\t%d\n", t.Name, t.Key, s.Name, peer, s.State, s.BytesIn, s.BytesOut)
						continue
					}
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", t.Name, t.Key, s.Name, s.Peer, s.State, s.PacketsIn, s.BytesIn, s.PacketsOut, s.BytesOut, s.Datapath)
				}
				name := t.Name
				if name == "" {
					name = "no tenant"
				}
				for cause, n := range t.Drops {
					drops = append(drops, fmt.Sprintf("%s: %d %s", name, n, cause))
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(drops) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "dropped: %s\n", strings.Join(drops, ", "))
			}
			return nil
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file of the deskway to ask (admin.listen, admin.tokens)")
	return c
}
