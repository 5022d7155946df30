package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/initramfs"
)

func streamInitramfsCmd() *cobra.Command {
	var o initramfs.Options
	var out string
	c := &cobra.Command{
		Use:   "initramfs --modules /lib/modules/VERSION --out FILE",
		Short: "Build the initramfs a network-booted device loads: its network card, DHCP, and the vDisk as root over the kernel's NBD client",
		Long: `Writes an initramfs (a newc cpio archive) for the kernel whose modules are
in --modules: a static busybox, deskway-nbdroot, the modules of NBD, of the
root file system (--fstype) and of the network cards the kernel has among
` + strings.Join(initramfs.DefaultDrivers, ", ") + ` (add others with
--driver), each with what it depends on. Name the file as the vDisk's
initrd in stream.vdisks, beside the same kernel.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Modules == "" || out == "" {
				return errors.New("stream initramfs: give --modules (the vDisk kernel's /lib/modules/VERSION) and --out")
			}
			if o.Nbdroot == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				o.Nbdroot = filepath.Join(filepath.Dir(exe), "deskway-nbdroot")
			}
			tmp := out + ".tmp"
			f, err := os.Create(tmp)
			if err != nil {
				return err
			}
			mods, err := initramfs.Build(f, o)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = os.Rename(tmp, out)
			}
			if err != nil {
				os.Remove(tmp)
				return err
			}
			names := make([]string, len(mods))
			for i, m := range mods {
				names[i] = m.Name
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d modules (%s)\n", out, len(mods), strings.Join(names, " "))
			return nil
		},
	}
	c.Flags().StringVar(&o.Modules, "modules", "", "the vDisk kernel's module tree, /lib/modules/VERSION")
	c.Flags().StringVar(&out, "out", "", "the initramfs file to write")
	c.Flags().StringVar(&o.FSType, "fstype", "ext4", "the root file system's type")
	c.Flags().StringSliceVar(&o.Drivers, "driver", nil, "more network card drivers (module names)")
	c.Flags().StringVar(&o.Busybox, "busybox", "/bin/busybox", "a statically linked busybox (Debian's busybox-static)")
	c.Flags().StringVar(&o.Nbdroot, "nbdroot", "", "deskway-nbdroot (default: beside this deskway)")
	return c
}
