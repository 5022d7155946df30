package cli

import (
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/config"
)

func tokenCmd() *cobra.Command {
	var (
		cfgPath, user, host string
		port                int
		ttl                 time.Duration
		groups              []string
	)
	c := &cobra.Command{
		Use:   "token",
		Short: "Mint a gateway access (PAA) token for a user and target, for /gat: or an .rdp file",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tk, err := tokensFrom(cfgPath, "token")
			if err != nil {
				return err
			}
			if user == "" || host == "" {
				return errors.New("token: --user and --host are required")
			}
			s, err := tk.Mint(user, groups, host, port, ttl)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), s)
			return nil
		},
	}
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "config file holding auth.token_key")
	c.Flags().StringVar(&user, "user", "", "user the token is for")
	c.Flags().StringSliceVar(&groups, "groups", nil, "groups to assert for the user")
	c.Flags().StringVar(&host, "host", "", "RDP host the token allows")
	c.Flags().IntVar(&port, "port", 3389, "RDP port the token allows")
	c.Flags().DurationVar(&ttl, "ttl", 5*time.Minute, "how long the token is valid")
	c.AddCommand(joinCmd())
	return c
}

// tokensFrom loads the config at path and returns a signer with its
// auth.token_key; what names the command in errors.
func tokensFrom(path, what string) (*auth.Tokens, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	if !cfg.Auth.TokenKey.IsSet() {
		return nil, fmt.Errorf("%s: auth.token_key is not set in %s", what, path)
	}
	return auth.NewTokens([]byte(cfg.Auth.TokenKey.Value()), nil)
}

func nthashCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "nthash PASSWORD",
		Short: "Print the NT hash of a password, for auth.users[].nt_hash",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			h := auth.NTHash(args[0])
			fmt.Fprintln(cmd.OutOrStdout(), hex.EncodeToString(h[:]))
			return nil
		},
	}
}
