package cli

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/stream"
)

func vdiskCmd() *cobra.Command {
	c := &cobra.Command{Use: "vdisk", Short: "vDisks of the stream role: versions and private images (through the admin API)"}
	ac := adminConfigFlag(c.PersistentFlags())
	c.AddCommand(vdiskVersionCmd(ac), vdiskPrivateCmd(ac))
	return c
}

func vdiskVersionCmd(ac *adminConfig) *cobra.Command {
	c := &cobra.Command{Use: "version", Short: "A vDisk's versions: list, make, promote, demote, delete"}
	base := func(vdisk string) string { return "/api/v1/stream/vdisks/" + url.PathEscape(vdisk) + "/versions" }
	show := func(cmd *cobra.Command, vdisk string, v stream.Version) {
		fmt.Fprintf(cmd.OutOrStdout(), "%s version %d: %s\n", vdisk, v.Version, v.Stage)
	}
	ls := &cobra.Command{
		Use:   "ls VDISK",
		Short: "List the versions, with the devices each is running on (their live boots on this server)",
		Args:  cobra.ExactArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			var vs struct{ Versions []stream.Version }
			if err := a.call(cmd.Context(), "GET", base(args[0]), nil, &vs); err != nil {
				return err
			}
			var bs struct{ Boots []stream.BootInfo }
			if err := a.call(cmd.Context(), "GET", "/api/v1/stream/boots", nil, &bs); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tSTAGE\tMADE\tRUNNING ON\tNOTE")
			for _, v := range vs.Versions {
				made, running := "-", []string{}
				if !v.Created.IsZero() {
					made = v.Created.Local().Format(time.DateTime)
				}
				for _, b := range bs.Boots {
					if b.VDisk == args[0] && b.Version == v.Version {
						running = append(running, b.Client)
					}
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", v.Version, v.Stage, made, orDash(strings.Join(running, ", ")), orDash(v.Note))
			}
			return tw.Flush()
		}),
	}
	var note string
	create := &cobra.Command{
		Use:   "new VDISK [--note TEXT]",
		Short: "Start a maintenance version on top of the newest one",
		Args:  cobra.ExactArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			var v stream.Version
			if err := a.call(cmd.Context(), "POST", base(args[0]), map[string]string{"note": note}, &v); err != nil {
				return err
			}
			show(cmd, args[0], v)
			return nil
		}),
	}
	create.Flags().StringVar(&note, "note", "", "what the version changes")
	step := func(verb, short string, aliases ...string) *cobra.Command {
		return &cobra.Command{
			Use:     verb + " VDISK VERSION",
			Aliases: aliases,
			Short:   short,
			Args:    cobra.ExactArgs(2),
			RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
				if _, err := strconv.Atoi(args[1]); err != nil {
					return errors.New("VERSION is a version's number, as vdisk version ls lists them")
				}
				var v stream.Version
				if err := a.call(cmd.Context(), "POST", base(args[0])+"/"+args[1]+"/"+verb, nil, &v); err != nil {
					return err
				}
				show(cmd, args[0], v)
				return nil
			}),
		}
	}
	del := &cobra.Command{
		Use:   "delete VDISK VERSION",
		Short: "Delete a version no device is assigned to or running, and no other version is built on",
		Args:  cobra.ExactArgs(2),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			if _, err := strconv.Atoi(args[1]); err != nil {
				return errors.New("VERSION is a version's number, as vdisk version ls lists them")
			}
			if err := a.call(cmd.Context(), "DELETE", base(args[0])+"/"+args[1], nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s version %s: deleted\n", args[0], args[1])
			return nil
		}),
	}
	c.AddCommand(ls, create,
		step("promote", "Move a version one stage on: maintenance to test, test to production"),
		step("demote", "Move a version one stage back (revert): production to test, test to maintenance", "revert"),
		del)
	return c
}

func vdiskPrivateCmd(ac *adminConfig) *cobra.Command {
	c := &cobra.Command{Use: "private", Short: "Private images of a private-mode vDisk, one per client"}
	var clients []string
	create := &cobra.Command{
		Use:   "create VDISK --client NAME [--client NAME...]",
		Short: "Make a client's private image, a copy of the vDisk's newest production version, before its first boot",
		Long: `A private-mode vDisk gives each client (a network-booted device: its
device name) an image of its own, kept across power-ons. A client that
is not listed in stream.vdisks[].clients gets one only once an
administrator made it, so that made-up names cannot each cost a copy.`,
		Args: cobra.ExactArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			if len(clients) == 0 {
				return errors.New("name the client with --client (a network-booted device's name)")
			}
			for _, cl := range clients {
				var out struct{ State string }
				path := "/api/v1/stream/vdisks/" + url.PathEscape(args[0]) + "/private/" + url.PathEscape(cl)
				if err := a.call(cmd.Context(), "POST", path, nil, &out); err != nil {
					return err
				}
				if out.State == "in use" {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: the private image of %s exists and is in use (its writer is connected)\n", cl, args[0])
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: private image of %s ready\n", cl, args[0])
			}
			return nil
		}),
	}
	create.Flags().StringArrayVar(&clients, "client", nil, "the client (device name); repeat for several")
	c.AddCommand(create)
	return c
}

func collectionCmd() *cobra.Command {
	c := &cobra.Command{Use: "collection", Short: "Device collections as units: list, assign a vDisk, enable, disable every device of one (through the admin API)"}
	ac := adminConfigFlag(c.PersistentFlags())
	path := func(name, verb string) string {
		return "/api/v1/stream/collections/" + url.PathEscape(name) + "/" + verb
	}
	type answer struct {
		Devices []struct {
			Name, VDisk, Stage string
			Enabled            bool
		}
	}
	show := func(cmd *cobra.Command, name string, out answer) {
		for _, d := range out.Devices {
			state := "enabled"
			if !d.Enabled {
				state = "disabled"
			}
			stage := ""
			if d.Stage != "" {
				stage = " (" + d.Stage + ")"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s: vDisk %s%s, %s\n", name, d.Name, orDash(d.VDisk), stage, state)
		}
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the collections",
		Args:  cobra.NoArgs,
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, _ []string) error {
			var out struct {
				Collections []struct {
					Name                       string
					Devices, Enabled, Disabled int
				}
			}
			if err := a.call(cmd.Context(), "GET", "/api/v1/stream/collections", nil, &out); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "COLLECTION\tDEVICES\tENABLED\tDISABLED")
			for _, c := range out.Collections {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", c.Name, c.Devices, c.Enabled, c.Disabled)
			}
			return tw.Flush()
		}),
	}
	var assign struct {
		VDisk string `json:"vdisk"`
		Stage string `json:"stage"`
	}
	assignCmd := &cobra.Command{
		Use:   "assign COLLECTION --vdisk VDISK [--stage STAGE]",
		Short: "Set the vDisk (and stage) every device of a collection boots from its next power-on",
		Args:  cobra.ExactArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			var out answer
			if err := a.call(cmd.Context(), "POST", path(args[0], "assign"), assign, &out); err != nil {
				return err
			}
			show(cmd, args[0], out)
			return nil
		}),
	}
	assignCmd.Flags().StringVar(&assign.VDisk, "vdisk", "", "the vDisk")
	assignCmd.Flags().StringVar(&assign.Stage, "stage", "", "production (default), test or maintenance")
	toggle := func(verb, short string) *cobra.Command {
		return &cobra.Command{
			Use:   verb + " COLLECTION",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
				var out answer
				if err := a.call(cmd.Context(), "POST", path(args[0], verb), nil, &out); err != nil {
					return err
				}
				show(cmd, args[0], out)
				return nil
			}),
		}
	}
	c.AddCommand(ls, assignCmd, menuCmd(ac, "collections", "collection"), toggle("enable", "Let every device of a collection boot"), toggle("disable", "Stop every device of a collection from booting"))
	return c
}
