package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/deskway/deskway/internal/config"
)

// TestInitMakesWhatThePackagedConfigNames: deskway init makes every file
// deploy/deskway.yaml refers to, with the modes and group the services
// need, so that the packaged config loads; run again it replaces nothing
// (a changed token stays as it is) and says nothing.
func TestInitMakesWhatThePackagedConfigNames(t *testing.T) {
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	shipped, err := os.ReadFile("../../deploy/deskway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "deskway.yaml")
	body := strings.NewReplacer("/etc/deskway/", etc+"/", "/var/lib/deskway", filepath.Join(dir, "state")).Replace(string(shipped))
	if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	group, gid := "", os.Getgid()
	if os.Geteuid() == 0 {
		if g, err := user.LookupGroup("daemon"); err == nil {
			group = g.Name
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	env := filepath.Join(dir, "default", "deskway")
	args := []string{"init", "--dir", etc, "--group", group, "--env-file", env, "-c", cfgPath}
	var out, errb bytes.Buffer
	if code := Main(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("init: %d %s", code, errb.String())
	}
	for _, want := range []string{"What next", "https://127.0.0.1:8446/", "https://127.0.0.1:9443/api/v1/broker/hosts", etc + "/admin.token", etc + "/admin.password"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("init's advice lacks %q:\n%s", want, out.String())
		}
	}
	modes := map[string]os.FileMode{"token.key": 0o640, "admin.token": 0o640, "portal.token": 0o640, "admin.password": 0o640, "tls.key": 0o640, "tls.crt": 0o644}
	for name, mode := range modes {
		fi, err := os.Stat(filepath.Join(etc, name))
		if err != nil {
			t.Fatalf("init made no %s: %v", name, err)
		}
		if fi.Mode().Perm() != mode || int(fi.Sys().(*syscall.Stat_t).Gid) != gid {
			t.Errorf("%s is %v group %d, want %v group %d", name, fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid, mode, gid)
		}
	}
	if fi, err := os.Stat(env); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("the environment file: %v %v", fi, err)
	}
	if _, err := config.Load(cfgPath); err != nil {
		t.Fatalf("the packaged config with what init made: %v", err)
	}

	// Again, after an operator changed the admin token: nothing replaced.
	tok := filepath.Join(etc, "admin.token")
	if err := os.WriteFile(tok, []byte("chosen-by-the-operator\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(filepath.Join(etc, "tls.key"))
	out.Reset()
	if code := Main(context.Background(), args, &out, &errb); code != 0 || out.Len() != 0 {
		t.Fatalf("init again: %d %q %s", code, out.String(), errb.String())
	}
	if b, _ := os.ReadFile(tok); string(b) != "chosen-by-the-operator\n" {
		t.Errorf("init again replaced the admin token: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(etc, "tls.key")); !bytes.Equal(b, key) {
		t.Error("init again replaced the TLS key")
	}

	// A certificate without its key is not paired with a new key.
	os.Remove(filepath.Join(etc, "tls.key"))
	errb.Reset()
	if code := Main(context.Background(), args, io.Discard, &errb); code == 0 || !strings.Contains(errb.String(), "only one of") {
		t.Fatalf("init with tls.crt alone: %d %s", code, errb.String())
	}
}
