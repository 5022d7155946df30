package cli

import (
	"fmt"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/deskway/deskway/internal/config"
)

func configCmd() *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Work with the config file"}
	c.AddCommand(&cobra.Command{
		Use:   "validate FILE",
		Short: "Check a config file and print it with every default filled in",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.Load(args[0])
			if err != nil {
				return err
			}
			b, err := yaml.Marshal(cfg)
			if err != nil {
				return fmt.Errorf("config: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "# %s is valid; effective settings:\n%s", args[0], b)
			return nil
		},
	})
	return c
}
