package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/bench/faults"
	"github.com/deskway/deskway/internal/obs"
)

func benchFaultsCmd() *cobra.Command {
	var (
		out, scenario string
		runs          int
		small         bool
	)
	var names []string
	for _, s := range faults.Scenarios() {
		names = append(names, s.Name)
	}
	c := &cobra.Command{
		Use:   "faults",
		Short: "Fault injection under load with real clients: kill a node, stop the database, ...; who noticed, how long, what was lost",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			work, err := os.MkdirTemp("", "deskway-faults-")
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			defer os.RemoveAll(work)
			log := obs.NewLogger(cmd.ErrOrStderr(), "info", "auto")
			env := faults.Env{Log: log, Bin: exe, Work: work, Small: small, HoldXRDP: holdXRDP(log)}
			res, err := faults.Bench(cmd.Context(), env, strings.Split(scenario, ","), runs, out)
			if err != nil {
				return err
			}
			printSummary(cmd, res, out)
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "directory for result.json and result.md")
	c.Flags().StringVar(&scenario, "scenario", "all", "comma-separated: "+strings.Join(names, ", ")+", or all")
	c.Flags().IntVar(&runs, "runs", 3, "runs of every scenario, interleaved")
	c.Flags().BoolVar(&small, "small", false, "the tests' scale (a few clients): the same zero-loss checks, in less time")
	return c
}
