package cli

import (
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
)

func gatewayCmd() *cobra.Command {
	return roleCmd("gateway", "Run the RD Gateway (MS-TSGU over websocket and RDG_IN/OUT_DATA)", true, gatewayOnly)
}

// gatewayOnly readies cfg and the process for the gateway role alone.
func gatewayOnly(cfg *config.Config) error {
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
	if os.Getenv("GOGC") == "" {
		// The process holds the gateway role alone, so its heap is its
		// tunnels' (see gateway.GCPercent).
		debug.SetGCPercent(gateway.GCPercent)
	}
	return nil
}
