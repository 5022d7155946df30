package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
)

// roleCmd is a command that runs one role of a config file alone: it
// loads --config, hands the config to only, which checks the role's
// section and drops the other roles' (the file may configure several),
// and runs what is left. With clock it has the hidden --clock-offset.
func roleCmd(use, short string, clock bool, only func(cfg *config.Config) error) *cobra.Command {
	var (
		cfgPath     string
		clockOffset time.Duration
	)
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if err := only(cfg); err != nil {
				return err
			}
			cfg.ClockOffset = clockOffset
			return runRoles(cmd.Context(), cfgPath, cfg, cmd.ErrOrStderr(), nil)
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file")
	if clock {
		hiddenClockOffset(c, &clockOffset)
	}
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
