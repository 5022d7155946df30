package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
)

// roleCmd is a command that runs one role of a config file alone: it
// loads --config, hands the config to only, which checks the role's
// section and drops the other roles' (the file may configure several),
// and runs what is left. With clock it has the hidden --clock-offset and
// --clock-offset-file.
func roleCmd(use, short string, withClock bool, only func(cfg *config.Config) error) *cobra.Command {
	var (
		cfgPath string
		clock   clockFlags
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
			cfg.ClockOffset, cfg.ClockFile = clock.offset, clock.file
			return runRoles(cmd.Context(), cfgPath, cfg, cmd.ErrOrStderr(), nil)
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file")
	if withClock {
		hiddenClockFlags(c, &clock)
	}
	return c
}

// clockFlags are the hidden flags that move a role's token clock.
type clockFlags struct {
	offset time.Duration
	file   string
}

// hiddenClockFlags adds --clock-offset, which moves the clock the role's
// tokens are signed and checked by, and --clock-offset-file, a file
// holding that offset, read each time the clock is, so that rewriting it
// steps the clock mid-run. They exist for `deskway bench faults` (a role
// whose clock is off, or jumps) and are hidden from help: no deployment
// should set them.
func hiddenClockFlags(c *cobra.Command, f *clockFlags) {
	c.Flags().DurationVar(&f.offset, "clock-offset", 0, "test only: move this role's token clock by this much")
	c.Flags().StringVar(&f.file, "clock-offset-file", "", "test only: a file holding the token clock's offset, read each time the clock is")
	_ = c.Flags().MarkHidden("clock-offset")
	_ = c.Flags().MarkHidden("clock-offset-file")
}
