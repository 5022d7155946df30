// Package cli wires deskway's subcommands to the roles; it holds no logic
// of its own beyond reading flags and config.
package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/obs"
)

// Version is set at build time with -ldflags "-X .../cli.Version=v1.2.3"
// (the Makefile's GO_LDFLAGS); a build without it reports what the Go
// toolchain recorded (obs.ReadBuild).
var Version = "dev"

// Revision is the source revision, set at build time as Version is; a
// build without it reports the one the Go toolchain recorded, if any.
var Revision = ""

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
	root.AddCommand(runCmd(), gatewayCmd(), brokerCmd(), agentCmd(), streamCmd(), upCmd(), configCmd(), tokenCmd(), hostCmd(), groupCmd(), deviceCmd(), sessionCmd(), versionCmd(), nthashCmd(), benchCmd(), initCmd())
	root.AddCommand(backupCmd(), restoreCmd(), siteCmd(), vdiskCmd(), collectionCmd())
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
			b := obs.ReadBuild(Version, Revision)
			fmt.Fprintf(cmd.OutOrStdout(), "deskway %s (revision %s, %s)\n", b.Version, b.Revision, b.GoVersion)
			return nil
		},
	}
}
