package cli

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/stream"
)

func streamCmd() *cobra.Command {
	c := roleCmd("stream", "Run the vDisk streaming server (NBD): diskless clients boot a shared image with private write caches", false, func(cfg *config.Config) error {
		if cfg.Stream == nil {
			return errors.New("the config has no stream section: add stream.vdisks (name, base) to serve")
		}
		// Only this role runs, whatever else the file configures.
		cfg.Gateway, cfg.Broker, cfg.Web, cfg.Agent, cfg.Site = nil, nil, nil, nil, nil
		if os.Getenv("GOMEMLIMIT") == "" {
			// The process holds the stream role alone, so its heap is
			// what the role's buffers bound.
			debug.SetMemoryLimit(stream.MemoryLimit(cfg.Stream))
		}
		return nil
	})
	c.AddCommand(streamCertCmd(), streamInitramfsCmd(), streamForgetLostCmd())
	return c
}

// streamForgetLostCmd lets a client with a fixed export name (VDISK/CLIENT,
// no boot id) in again after its boot's write cache was lost: such a
// client cannot start a new boot by itself.
func streamForgetLostCmd() *cobra.Command {
	ac := &adminConfig{}
	c := &cobra.Command{
		Use:   "forget-lost VDISK CLIENT",
		Short: "Forget the lost boots of a client, so that its next connection starts a new boot (through the admin API)",
		Long: `A boot whose write cache was lost (the server stopped without
stream.shared_cache, or the client stayed away past stream.reconnect_window)
is refused, so that the client's disk fails loudly instead of forgetting
what it wrote. A client that puts a new boot id in its export name every
boot gets back by booting again; one with a fixed name (VDISK/CLIENT)
cannot, and needs this: its next connection starts from the vDisk afresh.`,
		Args: cobra.ExactArgs(2),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			var out struct{ Forgotten []string }
			path := "/api/v1/stream/vdisks/" + url.PathEscape(args[0]) + "/clients/" + url.PathEscape(args[1]) + "/lost"
			if err := a.call(cmd.Context(), "DELETE", path, nil, &out); err != nil {
				return err
			}
			if len(out.Forgotten) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "client %s has no lost boot of %s\n", args[1], args[0])
				return nil
			}
			for _, k := range out.Forgotten {
				fmt.Fprintf(cmd.OutOrStdout(), "forgot lost boot %s\n", k)
			}
			return nil
		}),
	}
	ac.addFlag(c.Flags())
	return c
}
