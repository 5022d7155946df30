package cli

import (
	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
)

func gatewayCmd() *cobra.Command {
	var cfgPath string
	c := &cobra.Command{
		Use:   "gateway",
		Short: "Run the RD Gateway (MS-TSGU over websocket and RDG_IN/OUT_DATA)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if cfg.Gateway == nil {
				cfg.Gateway = &config.Gateway{}
				cfg.ApplyDefaults()
				if err := cfg.Validate(); err != nil {
					return err
				}
			}
			// Only this role runs, whatever else the file has (the
			// package's file has the broker and the portal too).
			cfg.Broker, cfg.Stream, cfg.Web, cfg.Agent, cfg.Site = nil, nil, nil, nil, nil
			return runRoles(cmd.Context(), cfgPath, cfg, cmd.ErrOrStderr(), nil)
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file")
	return c
}
