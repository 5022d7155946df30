package cli

import (
	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
)

func gatewayCmd() *cobra.Command {
	return roleCmd("gateway", "Run the RD Gateway (MS-TSGU over websocket and RDG_IN/OUT_DATA)", true, func(cfg *config.Config) error {
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
		return nil
	})
}
