package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/tlsconf"
)

// envTemplate is what deskway init puts in the units' environment file
// when there is none: nothing set, only where things go.
const envTemplate = `# The environment of every deskway unit (EnvironmentFile=-/etc/default/deskway).
# Secrets the config names as env:NAME go here, one NAME=value a line,
# e.g. an LDAP reader's password for web.ldap.bind_password: env:LDAP_PASSWORD
#LDAP_PASSWORD=
# Go runtime settings, e.g. a soft memory limit:
#GOMEMLIMIT=4GiB
`

func initCmd() *cobra.Command {
	var dir, group, envFile, cfgPath string
	c := &cobra.Command{
		Use:   "init",
		Short: "Make the keys, self-signed certificate and credentials the packaged config names, keeping any that exist",
		Long: `Makes, in --dir, what /etc/deskway/deskway.yaml as packaged refers to:
token.key, tls.crt and tls.key (self-signed), admin.token, portal.token and
admin.password, owned by root and the group --group, mode 0640 (the
certificate 0644), and --env-file for the units' environment. A file that
exists is never replaced, so running it again (the package's postinst does,
on every install and upgrade) changes nothing that is there. Prints what
to do next when it made anything.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gid := -1
			if group != "" {
				g, err := user.LookupGroup(group)
				if err != nil {
					return fmt.Errorf("init: the group %s the files are for: %w (make it with adduser --system --group %s, or give --group)", group, err, group)
				}
				if gid, err = strconv.Atoi(g.Gid); err != nil {
					return fmt.Errorf("init: group %s has the id %q: %w", group, g.Gid, err)
				}
			}
			made, err := initFiles(dir, envFile, gid)
			if err != nil {
				return err
			}
			if len(made) > 0 {
				printInitNext(cmd.OutOrStdout(), made, dir, cfgPath)
			}
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", "/etc/deskway", "where the keys, certificate and credentials go")
	c.Flags().StringVar(&group, "group", "deskway", `the group that may read them (the services'); "" leaves the files in the caller's group`)
	c.Flags().StringVar(&envFile, "env-file", "/etc/default/deskway", `the units' environment file, made with comments only when missing ("" for none)`)
	c.Flags().StringVarP(&cfgPath, "config", "c", "/etc/deskway/deskway.yaml", "the config whose addresses the closing advice names")
	return c
}

// initFiles makes every missing file deskway init is for and returns the
// paths it made. gid < 0 leaves the files in the caller's group.
func initFiles(dir, envFile string, gid int) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("init: %w", err)
	}
	// Each a random value the packaged config names with file:PATH.
	secrets := []struct {
		name, what string
		size       int // random bytes, written base64url
	}{
		{"token.key", "the key gateway and broker tokens are signed with", 32},
		{"admin.token", "the admin API's bearer token", 24},
		{"portal.token", "the portal's credential at the broker", 24},
		{"admin.password", "the password of the portal and console user admin", 12},
	}
	var made []string
	for _, s := range secrets {
		path := filepath.Join(dir, s.name)
		ok, err := createOnce(path, []byte(random(s.size)+"\n"), 0o640, gid)
		if err != nil {
			return made, fmt.Errorf("init: %s (%s): %w", path, s.what, err)
		}
		if ok {
			made = append(made, path)
		}
	}
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	certOK, keyOK := exists(cert), exists(key)
	switch {
	case certOK != keyOK:
		return made, fmt.Errorf("init: only one of %s and %s exists; put its pair beside it, or remove it for a new self-signed pair", cert, key)
	case !certOK:
		if err := selfSignedOnce(cert, key, gid); err != nil {
			return made, err
		}
		made = append(made, cert, key)
	}
	if envFile != "" {
		if err := os.MkdirAll(filepath.Dir(envFile), 0o755); err != nil {
			return made, fmt.Errorf("init: %w", err)
		}
		ok, err := createOnce(envFile, []byte(envTemplate), 0o640, gid)
		if err != nil {
			return made, fmt.Errorf("init: %s: %w", envFile, err)
		}
		if ok {
			made = append(made, envFile)
		}
	}
	return made, nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// createOnce writes data to path with mode and group gid unless path
// exists, and says whether it did. The file appears whole or not at all:
// it is written under a temporary name and linked into place, and the link
// fails rather than replace a file made meanwhile.
func createOnce(path string, data []byte, mode fs.FileMode, gid int) (bool, error) {
	if exists(path) {
		return false, nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return false, err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := finishTemp(f, data, mode, gid); err != nil {
		return false, err
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func finishTemp(f *os.File, data []byte, mode fs.FileMode, gid int) error {
	err := f.Chmod(mode)
	if err == nil && gid >= 0 {
		err = f.Chown(-1, gid)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// selfSignedOnce makes a self-signed pair for this machine at cert and
// key: the key readable by gid alone, the certificate by everyone.
func selfSignedOnce(cert, key string, gid int) error {
	tmpDir, err := os.MkdirTemp(filepath.Dir(cert), ".tls.")
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	tc, tk := filepath.Join(tmpDir, "tls.crt"), filepath.Join(tmpDir, "tls.key")
	if err := tlsconf.SelfSigned(tc, tk, nil); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	for _, p := range []struct {
		from, to string
		mode     fs.FileMode
	}{{tk, key, 0o640}, {tc, cert, 0o644}} {
		data, err := os.ReadFile(p.from)
		if err != nil {
			return fmt.Errorf("init: %w", err)
		}
		if _, err := createOnce(p.to, data, p.mode, gid); err != nil {
			return fmt.Errorf("init: %s: %w", p.to, err)
		}
	}
	return nil
}

// printInitNext says what was made and how to go on: where the portal
// and the admin API will be (from the config, when it loads) and how to
// add people, session hosts and vDisks.
func printInitNext(out io.Writer, made []string, dir, cfgPath string) {
	portal, admin := "https://localhost:8446", "https://127.0.0.1:9443"
	if cfg, err := config.Load(cfgPath); err == nil {
		if cfg.Web != nil {
			portal = "https://" + localAddr(cfg.Web.Listen)
		}
		admin = "https://" + localAddr(cfg.Admin.Listen)
	}
	fmt.Fprintf(out, `deskway init made %s.
What next:
  systemctl enable --now deskway     every role %[2]s has, on loopback
  portal     %[3]s/  (user admin, password: cat %[4]s/admin.password; the admin console is at /admin/)
  admin API  %[5]s/api/v1/broker/hosts with the header "Authorization: Bearer $(cat %[4]s/admin.token)",
             or deskway host ls (it reads both from %[2]s)
  add a user: list it under auth.users in %[2]s (groups: [users] to see the desktops), then systemctl reload deskway
  add a session host: deskway token join --group desktops --uses 1 --ttl 1h makes its join token (/usr/share/doc/deskway/operations.md says how)
  add a vDisk: fill in the stream section of %[2]s, then systemctl restart deskway
`, strings.Join(made, ", "), cfgPath, portal, dir, admin)
}

// localAddr is where a listener on addr is reached from this machine.
func localAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}
