package cli

import (
	"fmt"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

func groupCmd() *cobra.Command {
	c := &cobra.Command{Use: "group", Short: "Delivery groups: list them, set or clear who may launch them (through the admin API)"}
	ac := adminConfigFlag(c.PersistentFlags())
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the delivery groups with who may launch them",
		Args:  cobra.NoArgs,
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, _ []string) error {
			var groups []brokerapi.DeliveryGroup
			if err := a.call(cmd.Context(), "GET", "/api/v1/broker/groups", nil, &groups); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "GROUP\tKIND\tUSERS\tGROUPS\tFROM")
			for _, g := range groups {
				from := g.EntitlementsFrom
				if g.SetBy != "" {
					from += " (" + g.SetBy + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", g.Name, g.Kind, list(g.Users), list(g.Groups), from)
			}
			return tw.Flush()
		}),
	}
	var users, groups []string
	var configured bool
	entitle := &cobra.Command{
		Use:   "entitle GROUP (--user NAME | --group NAME)... | --configured",
		Short: "Set who may launch a delivery group, replacing its configured users and groups on every broker; --configured brings those back",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if configured == (len(users)+len(groups) > 0) {
				return fmt.Errorf("give --user or --group names, or --configured, not both")
			}
			a, err := newAdminClient(ac.path)
			if err != nil {
				return err
			}
			path := "/api/v1/broker/groups/" + url.PathEscape(args[0]) + "/entitlements"
			var g brokerapi.DeliveryGroup
			if configured {
				err = a.call(cmd.Context(), "DELETE", path, nil, &g)
			} else {
				err = a.call(cmd.Context(), "PUT", path, brokerapi.EntitlementRequest{Users: users, Groups: groups}, &g)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: users %s, groups %s (from the %s)\n", g.Name, list(g.Users), list(g.Groups),
				map[string]string{"admin": "admin API", "configuration": "configuration"}[g.EntitlementsFrom])
			return nil
		},
	}
	entitle.Flags().StringArrayVar(&users, "user", nil, "a user who may launch the group (repeat for more)")
	entitle.Flags().StringArrayVar(&groups, "group", nil, "a group whose members may launch it (repeat for more)")
	entitle.Flags().BoolVar(&configured, "configured", false, "clear what was set: the configuration's users and groups apply again")
	c.AddCommand(ls, entitle)
	return c
}

// list is names for a table cell, "-" for none.
func list(names []string) string {
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ",")
}
