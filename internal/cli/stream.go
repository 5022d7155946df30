package cli

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
)

func streamCmd() *cobra.Command {
	var cfgPath string
	c := &cobra.Command{
		Use:   "stream",
		Short: "Run the vDisk streaming server (NBD): diskless clients boot a shared image with private write caches",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if cfg.Stream == nil {
				return errors.New("the config has no stream section: add stream.vdisks (name, base) to serve")
			}
			// Only this role runs, whatever else the file configures.
			cfg.Gateway = nil
			return runRoles(cmd.Context(), cfgPath, cfg, cmd.ErrOrStderr(), nil)
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file")
	c.AddCommand(streamCertCmd(), streamInitramfsCmd())
	return c
}
