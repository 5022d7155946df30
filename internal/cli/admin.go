package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
)

// adminClient calls the admin API of the deskway whose config file it
// read: its admin listener, its first admin token, and its certificate.
type adminClient struct {
	base, token string
	http        *http.Client
}

// adminConfig is the --config of a command that calls the admin API: the
// file naming admin.listen, admin.tokens and the listener's certificate.
type adminConfig struct{ path string }

// adminConfigFlag registers --config on fs (a group's persistent flags,
// so every subcommand shares it).
func adminConfigFlag(fs *pflag.FlagSet) *adminConfig {
	ac := &adminConfig{}
	ac.addFlag(fs)
	return ac
}

func (ac *adminConfig) addFlag(fs *pflag.FlagSet) {
	fs.StringVarP(&ac.path, "config", "c", "/etc/deskway/deskway.yaml", "config file of the deskway to ask (admin.listen, admin.tokens)")
}

// run is a subcommand's RunE that opens the admin client the config
// names and hands it to body.
func (ac *adminConfig) run(body func(cmd *cobra.Command, a *adminClient, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a, err := newAdminClient(ac.path)
		if err != nil {
			return err
		}
		return body(cmd, a, args)
	}
}

func newAdminClient(path string) (*adminClient, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	if len(cfg.Admin.Tokens) == 0 {
		return nil, fmt.Errorf("admin.tokens is empty in %s: the admin API needs a token", path)
	}
	host, port, err := net.SplitHostPort(cfg.Admin.Listen)
	if err != nil {
		return nil, fmt.Errorf("admin.listen %q: %w", cfg.Admin.Listen, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	certFile := cfg.TLS.Cert
	if certFile == "" {
		certFile = filepath.Join(cfg.StateDir, "tls.crt") // the one deskway made
	}
	pem, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("the admin listener's certificate: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no certificate", certFile)
	}
	return &adminClient{base: "https://" + net.JoinHostPort(host, port), token: cfg.Admin.Tokens[0].Value(),
		http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}}, nil
}

// call sends method path (with body as JSON, when given) and decodes the
// answer into out, when given; an error answer becomes an error with the
// server's words.
func (a *adminClient) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode >= 300 {
		var e struct{ Error string }
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s %s: %s", method, path, e.Error)
		}
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if src := resp.Header.Get("Deskway-Source"); src != "" {
		fmt.Fprintf(os.Stderr, "note: the database is unreachable; this is the broker's %s\n", src)
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

func hostCmd() *cobra.Command {
	var group string
	c := &cobra.Command{Use: "host", Short: "Session hosts: list, drain, end a drain, remove (through the admin API)"}
	ac := adminConfigFlag(c.PersistentFlags())
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the session hosts with their state",
		Args:  cobra.NoArgs,
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, _ []string) error {
			var hosts []struct {
				Name          string  `json:"name"`
				DeliveryGroup string  `json:"delivery_group"`
				Address       string  `json:"address"`
				Port          int     `json:"port"`
				Sessions      int     `json:"sessions"`
				SessionLimit  int     `json:"session_limit"`
				CPU           float64 `json:"cpu"`
				Status        string  `json:"status"`
				Unhealthy     string  `json:"unhealthy"`
			}
			if err := a.call(cmd.Context(), "GET", "/api/v1/broker/hosts?delivery_group="+url.QueryEscape(group), nil, &hosts); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "HOST\tGROUP\tADDRESS\tSESSIONS\tCPU\tSTATUS")
			for _, h := range hosts {
				status := h.Status
				if h.Unhealthy != "" {
					status += " (" + h.Unhealthy + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%.0f%%\t%s\n", h.Name, h.DeliveryGroup, net.JoinHostPort(h.Address, fmt.Sprint(h.Port)),
					h.Sessions, h.SessionLimit, 100*h.CPU, status)
			}
			return tw.Flush()
		}),
	}
	ls.Flags().StringVar(&group, "group", "", "only the hosts of this delivery group")
	drain := func(use, short string, on bool) *cobra.Command {
		return &cobra.Command{
			Use:   use + " HOST",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
				path, body := "/api/v1/broker/hosts/"+url.PathEscape(args[0])+"/drain", any(map[string]bool{"drain": true})
				if !on {
					path, body = "/api/v1/broker/hosts/"+url.PathEscape(args[0])+"/undrain", nil
				}
				if err := a.call(cmd.Context(), "POST", path, body, nil); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: drain %v\n", args[0], on)
				return nil
			}),
		}
	}
	remove := &cobra.Command{
		Use:   "remove HOST",
		Short: "Remove a host with no live sessions, so that a join token may register the name again",
		Args:  cobra.ExactArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			if err := a.call(cmd.Context(), "DELETE", "/api/v1/broker/hosts/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: removed\n", args[0])
			return nil
		}),
	}
	c.AddCommand(ls, drain("drain", "Let a host's sessions go on but give it no new ones", true),
		drain("undrain", "End a host's drain", false), remove)
	return c
}

func sessionCmd() *cobra.Command {
	var user string
	var all bool
	c := &cobra.Command{Use: "session", Short: "Sessions the broker placed: list, log off, disconnect, message, end a stale record (through the admin API)"}
	ac := adminConfigFlag(c.PersistentFlags())
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List live sessions (--all: ended ones too)",
		Args:  cobra.NoArgs,
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, _ []string) error {
			q := url.Values{"user": {user}}
			if all {
				q.Set("all", "1")
			}
			var sessions []struct {
				ID            string    `json:"id"`
				User          string    `json:"user"`
				DeliveryGroup string    `json:"delivery_group"`
				Host          string    `json:"host"`
				State         string    `json:"state"`
				Updated       time.Time `json:"updated"`
			}
			if err := a.call(cmd.Context(), "GET", "/api/v1/broker/sessions?"+q.Encode(), nil, &sessions); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tUSER\tGROUP\tHOST\tSTATE\tSINCE")
			for _, s := range sessions {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.User, s.DeliveryGroup, s.Host, s.State, s.Updated.Local().Format(time.DateTime))
			}
			return tw.Flush()
		}),
	}
	ls.Flags().StringVar(&user, "user", "", "only this user's sessions")
	ls.Flags().BoolVar(&all, "all", false, "ended sessions too")
	end := &cobra.Command{
		Use:   "end ID",
		Short: "End a session record the host no longer has (the user's next launch places a new session)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(args[0]) == "" {
				return errors.New("session end: give the session's id (deskway session ls)")
			}
			a, err := newAdminClient(ac.path)
			if err != nil {
				return err
			}
			if err := a.call(cmd.Context(), "DELETE", "/api/v1/broker/sessions/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "session %s: ended\n", args[0])
			return nil
		},
	}
	c.AddCommand(ls, end, commandStatusCmd(ac),
		commandCmd(ac, brokerapi.Logoff, "logoff ID", "Log a session's user off: the host's agent ends the session's programs", cobra.ExactArgs(1)),
		commandCmd(ac, brokerapi.Disconnect, "disconnect ID", "Disconnect a session's user; the session runs on and the next launch reconnects it", cobra.ExactArgs(1)),
		commandCmd(ac, brokerapi.Message, "message ID TEXT", "Show a message in a session", cobra.ExactArgs(2)))
	return c
}

// commandCmd is deskway session logoff, disconnect or message: it queues
// the command for the session's host and waits for its agent's answer.
func commandCmd(ac *adminConfig, kind, use, short string, args cobra.PositionalArgs) *cobra.Command {
	var wait time.Duration
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  args,
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			req := brokerapi.CommandRequest{}
			if kind == brokerapi.Message {
				req.Text = args[1]
			}
			var st brokerapi.CommandStatus
			if err := a.call(cmd.Context(), "POST", "/api/v1/broker/sessions/"+url.PathEscape(args[0])+"/"+kind, req, &st); err != nil {
				return err
			}
			for deadline := time.Now().Add(wait); st.State == store.CommandPending || st.State == store.CommandSent; {
				if !time.Now().Before(deadline) {
					if wait == 0 {
						fmt.Fprintf(cmd.OutOrStdout(), "session %s: %s %s on %s; see deskway session command %s\n", args[0], kind, st.State, st.Host, st.ID)
						return nil
					}
					return fmt.Errorf("session %s: %s still %s on %s after %s; see deskway session command %s", args[0], kind, st.State, st.Host, wait, st.ID)
				}
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(250 * time.Millisecond):
				}
				if err := a.call(cmd.Context(), "GET", "/api/v1/broker/commands/"+url.PathEscape(st.ID), nil, &st); err != nil {
					return err
				}
			}
			if st.State != store.CommandDone {
				return fmt.Errorf("session %s: %s %s on %s: %s", args[0], kind, st.State, st.Host, st.Error)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "session %s: %s done on %s\n", args[0], kind, st.Host)
			return nil
		}),
	}
	c.Flags().DurationVar(&wait, "wait", time.Minute, "how long to wait for the host's agent to carry it out, failing past it (0: queue it and return)")
	return c
}

// commandStatusCmd is deskway session command: where a command stands.
func commandStatusCmd(ac *adminConfig) *cobra.Command {
	return &cobra.Command{
		Use:   "command ID",
		Short: "Show where a logoff, disconnect or message stands",
		Args:  cobra.ExactArgs(1),
		RunE: ac.run(func(cmd *cobra.Command, a *adminClient, args []string) error {
			var st brokerapi.CommandStatus
			if err := a.call(cmd.Context(), "GET", "/api/v1/broker/commands/"+url.PathEscape(args[0]), nil, &st); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s of session %s (%s on %s): %s", st.ID, st.Kind, st.SessionID, st.User, st.Host, st.State)
			if st.Error != "" {
				fmt.Fprintf(cmd.OutOrStdout(), ": %s", st.Error)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return nil
		}),
	}
}
