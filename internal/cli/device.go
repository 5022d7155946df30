package cli

import (
	"fmt"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/netboot"
)

func deviceCmd() *cobra.Command {
	c := &cobra.Command{Use: "device", Short: "Network-booted devices, by MAC address: add, list, assign a vDisk, enable, disable, remove (through the admin API)"}
	ac := adminConfigFlag(c.PersistentFlags())
	show := func(cmd *cobra.Command, d netboot.Device) {
		state := "enabled"
		if !d.Enabled {
			state = "disabled"
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s (%s): vDisk %s, %s\n", d.Name, d.MAC, orDash(d.VDisk), state)
	}
	var req netboot.DeviceRequest
	add := &cobra.Command{
		Use:   "add --mac MAC --name NAME [--vdisk VDISK]",
		Short: "Register a machine by its MAC address; it boots its vDisk on its next power-on",
		Args:  cobra.NoArgs,
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, _ []string) error {
			var d netboot.Device
			if err := a.call(cmd.Context(), "POST", "/api/v1/stream/devices", req, &d); err != nil {
				return err
			}
			show(cmd, d)
			return nil
		}),
	}
	add.Flags().StringVar(&req.MAC, "mac", "", "the machine's Ethernet address")
	add.Flags().StringVar(&req.Name, "name", "", "the device's name (names its write cache and private image)")
	add.Flags().StringVar(&req.VDisk, "vdisk", "", "the vDisk it boots")
	add.Flags().StringVar(&req.Stage, "stage", "", "the vDisk version stage it boots: production (default), test or maintenance")
	add.Flags().StringVar(&req.Collection, "collection", "", "a collection to file it under")
	add.Flags().BoolVar(&req.Disabled, "disabled", false, "add it without letting it boot yet")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the devices",
		Args:  cobra.NoArgs,
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, _ []string) error {
			var out struct{ Devices []netboot.DeviceStatus }
			if err := a.call(cmd.Context(), "GET", "/api/v1/stream/devices", nil, &out); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DEVICE\tMAC\tCOLLECTION\tVDISK\tSTAGE\tSTATE\tLAST BOOT\tRUNNING")
			for _, d := range out.Devices {
				state, last := "enabled", "-"
				if !d.Enabled {
					state = "disabled"
				}
				if d.LastBoot != nil {
					last = d.LastBoot.Format("2006-01-02 15:04:05")
				}
				var running []string
				for _, r := range d.Running {
					running = append(running, fmt.Sprintf("%s v%d", r.VDisk, r.Version))
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, d.MAC, orDash(d.Collection), orDash(d.VDisk), orDash(d.Stage), state, last, orDash(strings.Join(running, ", ")))
			}
			return tw.Flush()
		}),
	}
	var assign netboot.DeviceRequest
	assignCmd := &cobra.Command{
		Use:   "assign DEVICE --vdisk VDISK",
		Short: "Set the vDisk (and stage) a device boots from its next power-on",
		Args:  cobra.ExactArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			var d netboot.Device
			if err := a.call(cmd.Context(), "POST", "/api/v1/stream/devices/"+url.PathEscape(args[0])+"/assign", assign, &d); err != nil {
				return err
			}
			show(cmd, d)
			return nil
		}),
	}
	assignCmd.Flags().StringVar(&assign.VDisk, "vdisk", "", "the vDisk")
	assignCmd.Flags().StringVar(&assign.Stage, "stage", "", "production (default), test or maintenance")
	toggle := func(verb, short string) *cobra.Command {
		return &cobra.Command{
			Use:   verb + " DEVICE",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
				var d netboot.Device
				if err := a.call(cmd.Context(), "POST", "/api/v1/stream/devices/"+url.PathEscape(args[0])+"/"+verb, nil, &d); err != nil {
					return err
				}
				show(cmd, d)
				return nil
			}),
		}
	}
	remove := &cobra.Command{
		Use:   "remove DEVICE",
		Short: "Forget a device: its MAC is unknown from its next power-on",
		Args:  cobra.ExactArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			if err := a.call(cmd.Context(), "DELETE", "/api/v1/stream/devices/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: removed\n", args[0])
			return nil
		}),
	}
	personality := &cobra.Command{
		Use:   "personality DEVICE [KEY=VALUE...]",
		Short: "Set a device's personality (its own settings: host name, role, site), replacing the one it had; none clears it",
		Long: `The personality reaches the booted system from the device's next
power-on: on the kernel command line as deskway.p.KEY=VALUE, and in
/etc/deskway/personality on its root disk, one KEY=VALUE a line, which
the initramfs writes before the vDisk's own init starts.`,
		Args: cobra.MinimumNArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			p := map[string]string{}
			for _, kv := range args[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("%q is not KEY=VALUE", kv)
				}
				p[k] = v
			}
			var d netboot.Device
			if err := a.call(cmd.Context(), "PUT", "/api/v1/stream/devices/"+url.PathEscape(args[0])+"/personality", map[string]any{"personality": p}, &d); err != nil {
				return err
			}
			if len(d.Personality) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: no personality\n", d.Name)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: personality%s\n", d.Name, strings.ReplaceAll(netboot.PersonalityArgs(d.Personality), " deskway.p.", " "))
			return nil
		}),
	}
	c.AddCommand(add, ls, assignCmd, personality, menuCmd(ac, "devices", "device"), toggle("enable", "Let a device boot"), toggle("disable", "Stop a device from booting: its console says why"), remove)
	return c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
