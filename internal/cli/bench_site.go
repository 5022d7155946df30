package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/bench/sitebench"
)

func benchSiteCmd() *cobra.Command {
	var out, systems string
	var o sitebench.Options
	c := &cobra.Command{
		Use:   "site",
		Short: "The RAS Gateway paper's table: TCP throughput office → desktop with 1 and 8 connections through deskway site's GRE and WireGuard, wireguard-go, the kernel's VXLAN and routed veths, and the failover of a pair of gateways, the active killed under 8 TCP connections (root; makes its own network namespaces; the failover needs PostgreSQL)",
		Args:  cobra.NoArgs,
		RunE: runBench(&out, func(ctx context.Context, r benchRun) (*report.Result, error) {
			o.Out, o.Command, o.Log = r.out, r.command, r.log
			if systems != "" {
				o.Systems = strings.Split(systems, ",")
			}
			return sitebench.Run(ctx, o)
		}),
	}
	c.Flags().StringVar(&out, "out", "", "directory for result.json, result.md and the chart")
	c.Flags().IntVar(&o.Runs, "runs", 3, "runs of every system, taking turns")
	c.Flags().DurationVar(&o.Window, "duration", 10*time.Second, "how long bytes are counted at the receiver, per point")
	c.Flags().DurationVar(&o.Warmup, "warmup", 2*time.Second, "ramp-up before each window, not counted")
	c.Flags().StringVar(&systems, "systems", "", "only these, comma-separated: "+strings.Join(sitebench.Systems, ", ")+" (default all)")
	c.Flags().StringVar(&o.WireGuardGo, "wireguard-go", "", "a wireguard-go program to compare with (default: the module proxy's latest, built with go install into the cache)")
	c.Flags().StringVar(&o.Cache, "cache", "", "where wireguard-go is built (default the user's cache folder, deskway/sitebench)")
	c.Flags().StringVar(&o.Profile, "profile", "", "folder for CPU profiles of deskway's GRE and WireGuard gateways and offices over the first run's windows (go tool pprof reads them)")
	return c
}
