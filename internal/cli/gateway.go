package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
)

func gatewayCmd() *cobra.Command {
	var (
		cfgPath string
		clock   clockFlags
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
			clock.apply(cfg)
			return runRoles(cmd.Context(), cfgPath, cfg, cmd.ErrOrStderr(), nil)
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file")
	hiddenClockFlags(c, &clock)
	return c
}

// clockFlags are the hidden flags that move a role's token clock.
type clockFlags struct {
	offset time.Duration
	file   string
}

func (f clockFlags) apply(cfg *config.Config) {
	cfg.ClockOffset, cfg.ClockFile = f.offset, f.file
}

// hiddenClockFlags adds --clock-offset, which moves the clock the role's
// tokens are signed and checked by, and --clock-offset-file, a file
// holding that offset, read each time the clock is, so that writing it
// steps the clock mid-run. They exist for `deskway bench faults` (a role
// whose clock is off, or jumps) and are hidden from help: no deployment
// should set them.
func hiddenClockFlags(c *cobra.Command, f *clockFlags) {
	c.Flags().DurationVar(&f.offset, "clock-offset", 0, "test only: move this role's token clock by this much")
	c.Flags().StringVar(&f.file, "clock-offset-file", "", "test only: a file holding the token clock's offset, read each time the clock is")
	_ = c.Flags().MarkHidden("clock-offset")
	_ = c.Flags().MarkHidden("clock-offset-file")
}
