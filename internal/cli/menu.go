package cli

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/netboot"
)

// menuCmd is `deskway device menu` or `deskway collection menu` (kind
// "devices" or "collections" in the admin API's path).
func menuCmd(ac *adminConfig, kind, what string) *cobra.Command {
	var def string
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "menu " + strings.ToUpper(what) + " [VDISK[@STAGE]...]",
		Short: "Set the boot menu of a " + what + " (the vDisks its console offers at power-on, with a default at a timeout); no entries removes it",
		Long: `At power-on, the machine's console lists the entries, each with a key
(1 to 9), and boots the one chosen, or the default when the timeout
passes with no key pressed. An entry is a vDisk, or VDISK@test, or
VDISK@maintenance for the vDisk assigned to the device. The server
boots only what the menu lists, whatever the machine asks.`,
		Args: cobra.MinimumNArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			var body struct {
				Menu *netboot.Menu `json:"menu"`
			}
			if len(args) > 1 {
				body.Menu = &netboot.Menu{Entries: args[1:], Default: def, Timeout: int(timeout / time.Second)}
			}
			var out struct {
				netboot.Device
				Devices []netboot.Device `json:"devices"`
			}
			if err := a.call(cmd.Context(), "PUT", "/api/v1/stream/"+kind+"/"+url.PathEscape(args[0])+"/menu", body, &out); err != nil {
				return err
			}
			if kind == "devices" {
				out.Devices = []netboot.Device{out.Device}
			}
			for _, d := range out.Devices {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", d.Name, menuText(d.Menu))
			}
			return nil
		}),
	}
	c.Flags().StringVar(&def, "default", "", "the entry booted at the timeout (default the first)")
	c.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long the menu waits for a key; 0 waits until one is pressed")
	return c
}

// menuText is a menu in words.
func menuText(m *netboot.Menu) string {
	if m == nil {
		return "no boot menu"
	}
	def := m.Default
	if def == "" {
		def = m.Entries[0]
	}
	wait := "waits for a key"
	if m.Timeout > 0 {
		wait = fmt.Sprintf("%d s", m.Timeout)
	}
	return fmt.Sprintf("boot menu %s (default %s, %s)", strings.Join(m.Entries, ", "), def, wait)
}
