package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

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
// this machine: make run, on a machine without the demo's desktop
// account and with no RDP server running, then each way of connecting
// with xfreerdp to the xrdp server make run started on port 3389, and
// checks each reaches the desktop, not the login box. Only the
// placeholders are filled in: the state directory, and the host account
// (HOSTUSER, HOSTPASSWORD: the desktop account make run made). Then the
// portal's Open in browser logs on with no password typed, to twm and
// an xterm, where a French browser types a command with é and € (the
// issue's "from make run to typing é"), and the portal follows the
// session: running, disconnected, logged off.
func TestREADMEQuickstart(t *testing.T) {
	// It judges no timing (its waits are a minute or two long); what it
	// shares with other tests, xrdp's sesman, the service ports and the
	// repository's bin/, it holds. It holds the other xrdp setup's lock
	// too: make run's agent reads every xrdp session on the machine.
	parallel(t)
	testkit.Require(t, "xfreerdp", "Xvfb", "import", "xrdp", "curl", "make")
	testkit.RequireRoot(t)
	testkit.Lock(t, testkit.LockSesman, testkit.LockSesmanSecond, testkit.LockServicePorts, lockRepoBin)
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
	for _, sesman := range []string{"127.0.0.1:3350", "[::1]:3350"} {
		// Another test's session manager would log make run's users on,
		// and go away with that test.
		if err := testkit.WaitPortClosed(sesman, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	withoutDemoAccount(t)
	display := testkit.Xvfb(t)
	state := t.TempDir()
	hostPassword := ""
	fill := func(s string) string {
		return strings.NewReplacer("/var/lib/deskway", state, "HOSTUSER", demoAccount, "HOSTPASSWORD", hostPassword).Replace(s)
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
		if v, ok := strings.CutPrefix(line, demoAccount+" password: "); ok {
			hostPassword = v
		}
	}
	if hostPassword == "" {
		t.Fatalf("the credentials file has no %s password:\n%s", demoAccount, creds)
	}
	// make run says what it did to the machine.
	for _, said := range []string{"session host: created the Unix account " + demoAccount, "session host: started xrdp"} {
		if !strings.Contains(up.Log.String(), said) {
			t.Fatalf("make run did not say %q:\n%s", said, lastLines(up.Log.String(), 40))
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
	// logged on by the gateway with the desktop account (nothing typed),
	// then the portal's view of the session as it runs, is disconnected
	// and is logged off.
	t.Run("portal-open-in-browser", func(t *testing.T) {
		password := ""
		for _, line := range strings.Split(string(creds), "\n") {
			if v, ok := strings.CutPrefix(line, "demo password: "); ok {
				password = v
			}
		}
		artifacts := filepath.Join("artifacts", t.Name())
		// A French person's browser: the page picks AZERTY from its language.
		ctx := newBrowserWith(t, chromedp.Flag("lang", "fr-FR"), chromedp.Flag("accept-lang", "fr-FR,fr"))
		mark := len(up.Log.String())
		portal := "https://localhost:8446"
		portalSignIn(t, ctx, portal, "demo", password, "desktops")
		tab := openSignedOn(t, ctx, "desktops")
		browserDesktopDrawn(t, tab, artifacts, up)
		// One log line, whatever else the tunnel's logger carries in it.
		if !regexp.MustCompile(`"msg":"desktop account's credentials put in the client info",[^\n]*"transport":"browser",[^\n]*"user":"demo",[^\n]*"account":"` + demoAccount + `"`).MatchString(up.Log.String()[mark:]) {
			t.Fatalf("no browser tunnel logged on as %s in the log:\n%s", demoAccount, lastLines(up.Log.String(), 20))
		}
		if asked, err := chromedp.Run(tab, chromedp.Evaluate[bool](`!document.getElementById('credentials').hidden || document.getElementById('password').value !== ''`)); err != nil || asked {
			t.Fatalf("the page asked for credentials (%v)", err)
		}
		// A real xrdp session with the window manager and a terminal.
		for _, prog := range []string{"Xorg", "twm", "xterm"} {
			if err := exec.Command("pgrep", "-u", demoAccount, "-x", prog).Run(); err != nil {
				t.Fatalf("no %s runs as %s", prog, demoAccount)
			}
		}
		typeInDemoXterm(t, tab, artifacts)
		shot(t, tab, artifacts, "desktop")
		// The portal shows demo's session, the one the broker placed.
		if labels := portalShows(t, ctx, portal, "desktops", "Running on", artifacts, "portal-running"); !slices.Contains(labels, "Log off") {
			t.Fatalf("a running session offers %q, no Log off", labels)
		}
		toFront(t, tab)
		if err := chromedp.Do(tab, chromedp.Click(chromedp.ID("disconnect"))); err != nil {
			t.Fatal(err)
		}
		if labels := portalShows(t, ctx, portal, "desktops", "Disconnected on", artifacts, "portal-disconnected"); !slices.Contains(labels, "Reconnect") || !slices.Contains(labels, "Log off") {
			t.Fatalf("a disconnected session offers %q, not Reconnect and Log off", labels)
		}
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("li.desktop[data-group='desktops'] form.logoff button"))); err != nil {
			t.Fatal(err)
		}
		// The portal answers the logoff with its page and a notice; going
		// on before it would cancel the form's request.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if href, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href`)); err == nil && strings.Contains(href, "notice=logoff") {
				break
			}
			if time.Now().After(deadline) {
				shot(t, ctx, artifacts, "portal-logoff-failed")
				t.Fatalf("the portal did not answer the logoff:\n%s", lastLines(up.Log.String(), 20))
			}
		}
		portalShows(t, ctx, portal, "desktops", "Not running.", artifacts, "portal-logged-off")
		for deadline := time.Now().Add(30 * time.Second); exec.Command("pgrep", "-u", demoAccount, "-x", "twm").Run() == nil; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the session's twm still runs after the logoff")
			}
		}
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
