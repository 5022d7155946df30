package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
)

// sqliteDatabase is the broker's SQLite file the config at path names;
// what names the command in errors.
func sqliteDatabase(path, what string) (string, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return "", err
	}
	if cfg.Broker == nil {
		return "", fmt.Errorf("%s: %s has no broker section, so there is no broker database here", what, path)
	}
	if !store.IsSQLite(cfg.Broker.Database.Value()) {
		return "", fmt.Errorf("%s: broker.database is PostgreSQL; use pg_dump and pg_restore for it (docs/operations.md, Backing up and restoring)", what)
	}
	return store.SQLitePath(cfg.Broker.Database.Value()), nil
}

func backupCmd() *cobra.Command {
	var cfgPath string
	c := &cobra.Command{
		Use:   "backup FILE",
		Short: "Copy the broker's SQLite database to FILE, consistently, while the broker runs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := sqliteDatabase(cfgPath, "backup")
			if err != nil {
				return err
			}
			if st, err := os.Stat(filepath.Dir(args[0])); err != nil || !st.IsDir() {
				return fmt.Errorf("backup: there is no directory %s to put %s in; make it (readable by root alone: mkdir -m 0700 %[1]s) or name another", filepath.Dir(args[0]), filepath.Base(args[0]))
			}
			switch err := store.Backup(cmd.Context(), db, args[0]); {
			case errors.Is(err, fs.ErrExist):
				return fmt.Errorf("backup: %s exists already; name a new file", args[0])
			case err != nil && !fileExists(db):
				return fmt.Errorf("backup: there is no broker database at %s", db)
			case err != nil:
				return fmt.Errorf("backup: could not copy %s to %s: %w", db, args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "backed up %s to %s\n", db, args[0])
			return nil
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file (for broker.database)")
	return c
}

func restoreCmd() *cobra.Command {
	var cfgPath string
	c := &cobra.Command{
		Use:   "restore FILE",
		Short: "Put a backup made by deskway backup in place of the broker's SQLite database; the broker must be stopped",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, err := sqliteDatabase(cfgPath, "restore")
			if err != nil {
				return err
			}
			switch err := store.Restore(cmd.Context(), args[0], db); {
			case errors.Is(err, store.ErrInUse):
				return fmt.Errorf("restore: a broker is running on %s; stop it first (systemctl stop deskway-broker, or deskway), then restore", db)
			case !fileExists(args[0]):
				return fmt.Errorf("restore: there is no backup at %s", args[0])
			case err != nil:
				return fmt.Errorf("restore: could not restore %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s to %s (%s, mode %04o); start the broker\n", args[0], db, ownerOf(db), store.DatabaseMode)
			return nil
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file (for broker.database)")
	return c
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// ownerOf names path's user and group, for the operator to check.
func ownerOf(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return "?"
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return "?"
	}
	u, g := strconv.Itoa(int(sys.Uid)), strconv.Itoa(int(sys.Gid))
	if x, err := user.LookupId(u); err == nil {
		u = x.Username
	}
	if x, err := user.LookupGroupId(g); err == nil {
		g = x.Name
	}
	return u + ":" + g
}
