package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
)

func gatewayCmd() *cobra.Command {
	var (
		cfgPath     string
		clockOffset time.Duration
	)
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
			cfg.ClockOffset = clockOffset
			return runRoles(cmd.Context(), cfgPath, cfg, cmd.ErrOrStderr(), nil)
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file")
	hiddenClockOffset(c, &clockOffset)
	return c
}

// hiddenClockOffset adds --clock-offset, which moves the clock the role's
// tokens are signed and checked by. It exists for `deskway bench faults`
// (a role whose clock is off) and is hidden from help: no deployment
// should set it.
func hiddenClockOffset(c *cobra.Command, d *time.Duration) {
	c.Flags().DurationVar(d, "clock-offset", 0, "test only: move this role's token clock by this much")
	_ = c.Flags().MarkHidden("clock-offset")
}
