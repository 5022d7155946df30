package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// readmeBlocks returns the shell blocks of README.md marked
// "<!-- e2e: NAME -->", by name: what a new user copies.
func readmeBlocks(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- e2e: ([a-z-]+) -->\n```sh\n(.*?)```")
	out := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = m[2]
	}
	return out
}

// TestREADMEQuickstart runs the README's own lines, as a new user would on
// this machine: make run, then each way of connecting with xfreerdp to
// the xrdp server on port 3389, and checks each reaches the desktop, not
// the login box. Only the placeholders are filled in: the state directory,
// and the host account (HOSTUSER, HOSTPASSWORD).
func TestREADMEQuickstart(t *testing.T) {
	testkit.Require(t, "xfreerdp", "Xvfb", "import", "xrdp", "curl", "make")
	testkit.RequireRoot(t)
	blocks := readmeBlocks(t)
	for _, name := range []string{"run", "portal", "gateway-password", "gateway-token", "broker-rdp", "stream-client"} {
		if blocks[name] == "" {
			t.Fatalf("README.md has no block marked <!-- e2e: %s -->", name)
		}
	}
	if strings.TrimSpace(blocks["run"]) != "make run" {
		t.Fatalf("the README's run block is %q; this test runs make run", blocks["run"])
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range []string{"8443", "8444", "8446", "9443", "10809", "3389"} {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second); err == nil {
			c.Close()
			t.Fatalf("port %s is taken; the README's commands use it", port)
		}
	}
	xrdp := testkit.StartXRDP(t, 3389)
	display := testkit.Xvfb(t)
	state := t.TempDir()
	fill := func(s string) string {
		return strings.NewReplacer("/var/lib/deskway", state, "HOSTUSER", xrdp.User, "HOSTPASSWORD", xrdp.Password).Replace(s)
	}

	// make run, as written; STATE_DIR (the Makefile's) keeps the test's
	// state out of /var/lib/deskway.
	up := testkit.Start(t, []string{"STATE_DIR=" + state}, "bash", "-c", "cd "+repo+" && "+blocks["run"])
	for _, port := range []string{"8443", "8444"} {
		if err := testkit.WaitPort("127.0.0.1:"+port, 120*time.Second); err != nil {
			t.Fatalf("make run: %v\n%s", err, lastLines(up.Log.String(), 40))
		}
	}
	creds, err := os.ReadFile(filepath.Join(state, "credentials"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(creds), "\n") {
		if _, secret, ok := strings.Cut(line, ": "); ok && strings.Contains(up.Log.String(), secret) {
			t.Fatalf("make run printed a secret from the credentials file:\n%s", up.Log.String())
		}
	}
	// The local agent registers the machine with the broker.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(up.Log.String(), `"msg":"registered"`); {
		if time.Now().After(deadline) {
			t.Fatalf("the local agent never registered:\n%s", lastLines(up.Log.String(), 40))
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The portal, as the README tells a person to use it: sign in as demo
	// in a browser and press Launch; the browser saves desktops.rdp, and the
	// README's line opens it in the folder it went to.
	downloads := t.TempDir()
	t.Run("portal-browser", func(t *testing.T) {
		password := ""
		for _, line := range strings.Split(string(creds), "\n") {
			if v, ok := strings.CutPrefix(line, "demo password: "); ok {
				password = v
			}
		}
		portalLaunch(t, "https://localhost:8446", "demo", password, "desktops", downloads)
	})
	tunnels := 0
	for _, name := range []string{"portal", "gateway-password", "gateway-token", "broker-rdp"} {
		t.Run(name, func(t *testing.T) {
			script := filepath.Join(t.TempDir(), name+".sh")
			dir := t.TempDir()
			if name == "portal" {
				dir = downloads
			}
			body := "set -e\ncd " + dir + "\n" + fill(blocks[name])
			// ./bin/deskway is the README's path from the repository; bin is
			// not on the PATH, so a bare deskway in the README fails here.
			body = strings.ReplaceAll(body, "./bin/deskway", filepath.Join(repo, "bin", "deskway"))
			if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
				t.Fatal(err)
			}
			untilDesktop(t, display, name, filepath.Join("artifacts", t.Name()+".png"), 60*time.Second, func(ctx context.Context) *exec.Cmd {
				cmd := exec.CommandContext(ctx, "bash", script)
				// xfreerdp runs under bash: stop the whole group.
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
				return cmd
			})
			tunnels++
			want := strings.Count(up.Log.String(), `"msg":"tunnel open"`)
			if want < tunnels {
				t.Fatalf("the gateway logged %d open tunnels after %d connections:\n%s", want, tunnels, lastLines(up.Log.String(), 20))
			}
		})
	}
	// Open in browser, as the README tells it: the same desktop in a tab,
	// the host account typed into the page.
	t.Run("portal-open-in-browser", func(t *testing.T) {
		password := ""
		for _, line := range strings.Split(string(creds), "\n") {
			if v, ok := strings.CutPrefix(line, "demo password: "); ok {
				password = v
			}
		}
		ctx := newBrowser(t)
		mark := len(up.Log.String())
		portalSignIn(t, ctx, "https://localhost:8446", "demo", password, "desktops")
		tab := openInBrowser(t, ctx, "desktops")
		connectInBrowser(t, tab, xrdp.User, xrdp.Password, filepath.Join("artifacts", t.Name()), up)
		if !strings.Contains(up.Log.String()[mark:], `"transport":"browser"`) {
			t.Fatalf("no browser tunnel in the log:\n%s", lastLines(up.Log.String(), 20))
		}
		shot(t, tab, filepath.Join("artifacts", t.Name()), "desktop")
	})
	// A stream client, as the README shows it: a certificate for pc1, a
	// copy of the base, and a write and read of pc1's own boot over TLS.
	t.Run("stream-client", func(t *testing.T) {
		testkit.Require(t, "nbdcopy", "qemu-io")
		dir := t.TempDir()
		body := "set -e\ncd " + dir + "\n" + fill(blocks["stream-client"])
		body = strings.ReplaceAll(body, "./bin/deskway", filepath.Join(repo, "bin", "deskway"))
		out, err := exec.Command("bash", "-c", body).CombinedOutput()
		if err != nil {
			t.Fatalf("the README's stream client lines: %v\n%s", err, out)
		}
		if st, err := os.Stat(filepath.Join(dir, "demo-copy.img")); err != nil || st.Size() != 256<<20 {
			t.Fatalf("nbdcopy's copy of the demo vDisk: %v %v\n%s", st, err, out)
		}
		if !strings.Contains(string(out), "read 4096/4096") || strings.Contains(string(out), "failed") {
			t.Fatalf("qemu-io over TLS with pc1's certificate:\n%s", out)
		}
	})
}
