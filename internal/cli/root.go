// Package cli wires deskway's subcommands to the roles; it holds no logic
// of its own beyond reading flags and config.
package cli

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is set at build time with -ldflags "-X .../cli.Version=v1.2.3".
var Version = "dev"

// Main runs the command line and returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "deskway",
		Short:         "Remote desktop delivery: RD Gateway, broker, host agent, vDisk streaming",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(runCmd(), gatewayCmd(), brokerCmd(), agentCmd(), streamCmd(), upCmd(), configCmd(), tokenCmd(), hostCmd(), groupCmd(), deviceCmd(), sessionCmd(), versionCmd(), nthashCmd(), benchCmd())
	root.AddCommand(backupCmd(), restoreCmd())
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "deskway:", err)
		return 1
	}
	return 0
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := Version
			if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" && len(s.Value) >= 12 {
						v = "dev-" + s.Value[:12]
					}
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), "deskway", v)
			return nil
		},
	}
}
