package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"debug/elf"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// lockRepoBin is held by the tests whose make targets write the
// repository's bin/deskway (make deb, make run), so that neither links
// over the binary the other is packaging or running. (make image writes
// bin/deskway-static and bin/deskway-image.tar, which no other test
// touches.)
const lockRepoBin = "e2e-repo-bin"

// packageUnits are the systemd units the package ships, in the order its
// prerm names them.
func packageUnits() []string {
	return []string{"deskway.service", "deskway-gateway.service", "deskway-broker.service", "deskway-agent.service", "deskway-stream.service", "deskway-site.service"}
}

// TestDebianPackage: the package make deb builds installs on this machine
// by the README's own lines (make deb, apt-get install), makes its system
// user, and deskway init makes the keys, certificate and credentials its
// config names, with the right owners and modes, and prints what to do
// next. The installed config starts as shipped: each unit's ExecStart is
// run as systemd would run it (user, capabilities, environment file,
// umask), the portal takes the admin user's password, the admin API and
// deskway host ls the generated token (the README's lines), /metrics says
// the package's version, and each stops cleanly on SIGTERM; the stream
// and agent units, which have nothing to serve until a vDisk or a broker
// is configured, say so and stop. An upgrade, with the maintainer scripts
// seeing a (recording) systemd, stops nothing, restarts the units that
// were running or enabled and keeps the keys; a removal stops every unit.
// Purging removes everything, or keeps the state with DESKWAY_KEEP_DATA=1.
func TestDebianPackage(t *testing.T) {
	// It judges no timing; what it shares with other tests are the
	// service ports and the repository's bin/, which it holds.
	parallel(t)
	testkit.RequireRoot(t)
	testkit.Require(t, "dpkg", "systemd-analyze", "setpriv", "adduser", "unshare", "curl")
	testkit.Lock(t, testkit.LockServicePorts, lockRepoBin)
	if exec.Command("dpkg-query", "-W", "deskway").Run() == nil {
		t.Fatal("a deskway package is already installed on this machine; this test installs and purges its own: dpkg -P deskway first")
	}
	for _, port := range []string{"8443", "8444", "8446", "9443"} {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second); err == nil {
			c.Close()
			t.Fatalf("port %s is taken; the packaged config listens on it", port)
		}
	}
	blocks := readmeBlocks(t)
	for _, name := range []string{"install-deb", "deb-admin-api"} {
		if blocks[name] == "" {
			t.Fatalf("README.md has no block marked <!-- e2e: %s -->", name)
		}
	}
	// docs/operations.md shows the same install and admin API lines, and
	// the session host's join token line this test runs too.
	docs := opsInstallBlocks(t)
	if len(docs) != 3 || docs[0] != blocks["install-deb"] || docs[1] != blocks["deb-admin-api"] || !strings.HasPrefix(docs[2], "deskway token join ") {
		t.Fatalf("docs/operations.md's \"Installing the package\" shows %q; want the README's install-deb and deb-admin-api lines, then deskway token join", docs)
	}
	t.Cleanup(func() { _ = exec.Command("dpkg", "-P", "deskway").Run() })
	inst := exec.Command("bash", "-ec", blocks["install-deb"])
	inst.Dir = ".."
	inst.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	out, err := inst.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's install-deb lines: %v\n%s", err, lastLines(string(out), 30))
	}
	for _, want := range []string{"What next", "https://127.0.0.1:8446/", "cat /etc/deskway/admin.password", "https://127.0.0.1:9443/api/v1/broker/hosts", "cat /etc/deskway/admin.token"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("installing printed no %q:\n%s", want, lastLines(string(out), 20))
		}
	}
	debs, _ := filepath.Glob("../bin/deskway_*_amd64.deb")
	if len(debs) != 1 {
		t.Fatalf("make deb left %d packages in bin/: %v", len(debs), debs)
	}
	deb := debs[0]
	vout, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "deskway").Output()
	if err != nil {
		t.Fatal(err)
	}
	version := string(vout)
	dpkg := func(env []string, args ...string) string {
		t.Helper()
		c := exec.Command("dpkg", args...)
		c.Env = append(os.Environ(), env...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	checkPackageFiles(t, version)
	units, _ := filepath.Glob("/lib/systemd/system/deskway*.service")
	if out, err := exec.Command("systemd-analyze", append([]string{"verify"}, units...)...).CombinedOutput(); err != nil || strings.Contains(string(out), "deskway") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	if out, err := exec.Command("/usr/bin/deskway", "version").Output(); err != nil || !strings.HasPrefix(string(out), "deskway "+version+" ") {
		t.Errorf("deskway version says %q (%v), not the package's version %s", out, err, version)
	}

	// Each unit as systemd would run it, with the config as shipped.
	for _, name := range []string{"deskway.service", "deskway-gateway.service", "deskway-broker.service"} {
		u := readUnit(t, "/lib/systemd/system/"+name)
		if u.user != "deskway" || u.group != "deskway" {
			t.Fatalf("%s: %+v", name, u)
		}
		cmd, log := startUnit(t, u)
		wait := map[string][]string{"deskway.service": {"8443", "8444", "8446", "9443"}, "deskway-gateway.service": {"8443", "9443"}, "deskway-broker.service": {"8444", "8446", "9443"}}[name]
		for _, port := range wait {
			if err := testkit.WaitPort("127.0.0.1:"+port, 20*time.Second); err != nil {
				t.Fatalf("%s as shipped: nothing on port %s: %v\n%s", name, port, err, lastLines(log.String(), 20))
			}
		}
		if out, err := exec.Command("ps", "-o", "user=", "-p", fmt.Sprint(cmd.Process.Pid)).Output(); err != nil || strings.TrimSpace(string(out)) != "deskway" {
			t.Errorf("%s runs as %q (%v), not deskway", name, out, err)
		}
		// It runs on a read-only system with its state directory
		// writable, as ProtectSystem=strict has it.
		mounts, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mounts", cmd.Process.Pid))
		if !regexp.MustCompile(`(?m)^\S+ / \S+ ro[, ]`).Match(mounts) || !regexp.MustCompile(`(?m)^\S+ /var/lib/deskway \S+ rw[, ]`).Match(mounts) {
			t.Errorf("%s does not see / read-only and /var/lib/deskway writable:\n%s", name, mounts)
		}
		checkBuildInfo(t, name, version, log)
		switch name {
		case "deskway.service":
			// The README's lines for the admin API, as written.
			c := exec.Command("bash", "-ec", blocks["deb-admin-api"])
			c.Env = append(os.Environ(), "PATH=/usr/sbin:/usr/bin:/sbin:/bin")
			// No session host yet: an empty list from the API, the
			// column heads alone from deskway host ls.
			if out, err := c.CombinedOutput(); err != nil || !strings.Contains(string(out), "[]") || !strings.Contains(string(out), "HOST  GROUP") {
				t.Errorf("the README's deb-admin-api lines: %v\n%s", err, out)
			}
			checkPortalSignIn(t)
		case "deskway-gateway.service":
			c, err := tls.Dial("tcp", "127.0.0.1:8443", &tls.Config{InsecureSkipVerify: true})
			if err != nil {
				t.Errorf("TLS to the packaged gateway: %v", err)
			} else {
				c.Close()
			}
		}
		stopUnit(t, name, cmd, log)
	}
	for name, want := range map[string]string{
		"deskway-stream.service": "the config has no stream section",
		"deskway-agent.service":  "the config has no agent section",
		"deskway-site.service":   "the config has no site section",
	} {
		u := readUnit(t, "/lib/systemd/system/"+name)
		if !slices.Contains(u.envFiles, "-/etc/default/deskway") {
			t.Errorf("%s has no EnvironmentFile=-/etc/default/deskway", name)
		}
		out, err := runUnitToExit(t, u)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("%s as shipped: %v, want it to stop saying %q:\n%s", name, err, want, out)
		}
	}
	addVDisk(t, version)
	join := exec.Command("bash", "-ec", docs[2])
	join.Env = append(os.Environ(), "PATH=/usr/sbin:/usr/bin:/sbin:/bin")
	if out, err := join.CombinedOutput(); err != nil || len(strings.Fields(string(out))) != 1 {
		t.Errorf("%s: %v\n%s", docs[2], err, out)
	}
	upgradeAndRemove(t, deb, version)

	// Purged with the data kept, then purged for good.
	dpkg([]string{"DESKWAY_KEEP_DATA=1"}, "-P", "deskway")
	if _, err := os.Stat("/var/lib/deskway"); err != nil {
		t.Fatalf("DESKWAY_KEEP_DATA=1 dpkg -P removed the state: %v", err)
	}
	dpkg(nil, "-i", deb)
	dpkg(nil, "-P", "deskway")
	for _, f := range []string{"/usr/bin/deskway", "/etc/deskway", "/etc/default/deskway", "/lib/systemd/system/deskway.service", "/var/lib/deskway"} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("dpkg -P left %s behind", f)
		}
	}
	if exec.Command("getent", "passwd", "deskway").Run() == nil || exec.Command("getent", "group", "deskway").Run() == nil {
		t.Error("dpkg -P left the deskway user or group behind")
	}
}

// checkPackageFiles checks what the installed package and deskway init
// put on the machine, their owners and modes, and the Debian policy files.
func checkPackageFiles(t *testing.T, version string) {
	t.Helper()
	for _, f := range []string{"/usr/bin/deskway", "/usr/bin/deskway-nbdroot", "/usr/share/doc/deskway/README.md", "/usr/share/doc/deskway/operations.md",
		"/usr/share/doc/deskway/copyright", "/usr/share/doc/deskway/changelog.Debian.gz"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the package did not install %s: %v", f, err)
		}
	}
	if out, err := exec.Command("getent", "passwd", "deskway").Output(); err != nil || !strings.Contains(string(out), ":/var/lib/deskway:") {
		t.Fatalf("no system user deskway with home /var/lib/deskway: %v %q", err, out)
	}
	want := map[string]string{
		"/etc/deskway/deskway.yaml":   "640 root:deskway",
		"/etc/deskway/token.key":      "640 root:deskway",
		"/etc/deskway/admin.token":    "640 root:deskway",
		"/etc/deskway/portal.token":   "640 root:deskway",
		"/etc/deskway/admin.password": "640 root:deskway",
		"/etc/deskway/tls.key":        "640 root:deskway",
		"/etc/deskway/tls.crt":        "644 root:deskway",
		"/etc/default/deskway":        "640 root:deskway",
	}
	for f, w := range want {
		if out, _ := exec.Command("stat", "-c", "%a %U:%G", f).Output(); strings.TrimSpace(string(out)) != w {
			t.Errorf("%s is %q, want %s", f, strings.TrimSpace(string(out)), w)
		}
	}
	out, err := exec.Command("sh", "-c", "zcat /usr/share/doc/deskway/changelog.Debian.gz | head -1").Output()
	if err != nil || !strings.HasPrefix(string(out), "deskway ("+version+") ") {
		t.Errorf("changelog.Debian.gz begins %q (%v), not with version %s", out, err, version)
	}
	if b, _ := os.ReadFile("/usr/share/doc/deskway/copyright"); !strings.HasPrefix(string(b), "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/") {
		t.Error("/usr/share/doc/deskway/copyright is not a machine-readable copyright file")
	}
	for _, bin := range []string{"/usr/bin/deskway", "/usr/bin/deskway-nbdroot"} {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{".symtab", ".debug_info"} {
			if f.Section(s) != nil {
				t.Errorf("%s is not stripped: it has %s", bin, s)
			}
		}
		f.Close()
	}
	for _, name := range packageUnits() {
		b, _ := os.ReadFile("/lib/systemd/system/" + name)
		if !strings.Contains(string(b), "\nEnvironmentFile=-/etc/default/deskway\n") {
			t.Errorf("%s has no EnvironmentFile=-/etc/default/deskway", name)
		}
	}
}

// checkBuildInfo checks that a running unit says the package's version
// in its start line and in deskway_build_info on /metrics.
func checkBuildInfo(t *testing.T, name, version string, log *testkit.Buffer) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get("https://127.0.0.1:9443/metrics")
	if err != nil {
		t.Errorf("%s /metrics: %v", name, err)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	re := regexp.MustCompile(`(?m)^deskway_build_info\{goversion="go[^"]+",revision="[0-9a-f]{40}",version="` + regexp.QuoteMeta(version) + `"\} 1$`)
	if !re.Match(b) {
		t.Errorf("%s /metrics has no deskway_build_info for version %s:\n%s", name, version, grepLines(string(b), "deskway_build_info"))
	}
	if !strings.Contains(log.String(), "deskway starting") || !strings.Contains(log.String(), version) {
		t.Errorf("%s's start line does not say version %s:\n%s", name, version, lastLines(log.String(), 10))
	}
}

// addVDisk adds a vDisk as docs/operations.md says, by filling in the
// config's commented stream section as it stands (its image at the path
// the comment names), and runs deskway-stream.service, which now serves
// it; the config is put back as it was.
func addVDisk(t *testing.T, version string) {
	t.Helper()
	const path = "/etc/deskway/deskway.yaml"
	shipped, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(path, shipped, 0o640)
	lines := strings.Split(string(shipped), "\n")
	start := slices.Index(lines, "# stream:")
	if start < 0 {
		t.Fatalf("%s has no commented stream section", path)
	}
	base := ""
	for i := start; i < len(lines) && strings.HasPrefix(lines[i], "# "); i++ {
		lines[i] = strings.TrimPrefix(lines[i], "# ")
		if b, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "base: "); ok {
			base, _, _ = strings.Cut(b, " ")
		}
	}
	if base == "" {
		t.Fatalf("the stream section of %s names no base image", path)
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o640); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(base), 0o750)
	if err := os.WriteFile(base, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	os.Truncate(base, 64<<20)
	exec.Command("chown", "-R", "deskway:deskway", filepath.Dir(base)).Run()
	u := readUnit(t, "/lib/systemd/system/deskway-stream.service")
	cmd, log := startUnit(t, u)
	for _, port := range []string{"10809", "9443"} {
		if err := testkit.WaitPort("127.0.0.1:"+port, 20*time.Second); err != nil {
			t.Fatalf("deskway-stream.service with a vDisk: nothing on port %s: %v\n%s", port, err, lastLines(log.String(), 20))
		}
	}
	checkBuildInfo(t, "deskway-stream.service", version, log)
	stopUnit(t, "deskway-stream.service", cmd, log)
}

// opsInstallBlocks returns the shell blocks of docs/operations.md's
// "Installing the package" section.
func opsInstallBlocks(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(b), "## Installing the package\n")
	if i < 0 {
		t.Fatal("docs/operations.md has no \"Installing the package\" section")
	}
	sec, _, _ := strings.Cut(string(b[i:]), "\n## The container image")
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(sec, -1) {
		out = append(out, m[1])
	}
	return out
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// checkPortalSignIn signs in to the portal at https://localhost:8446 as
// admin with the password deskway init wrote, as the README says, and
// opens the admin console, checking the certificate against the one
// deskway init made.
func checkPortalSignIn(t *testing.T) {
	t.Helper()
	pw, err := os.ReadFile("/etc/deskway/admin.password")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile("/etc/deskway/tls.crt")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		t.Fatal("/etc/deskway/tls.crt holds no certificate")
	}
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := c.PostForm("https://localhost:8446/signin", url.Values{"user": {"admin"}, "password": {strings.TrimSpace(string(pw))}})
	if err != nil {
		t.Errorf("signing in to the portal: %v", err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusSeeOther {
		t.Errorf("signing in to the portal as admin: %s", resp.Status)
		return
	}
	resp, err = c.Get("https://localhost:8446/admin/")
	if err != nil {
		t.Errorf("the admin console: %v", err)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "admin") || strings.Contains(string(b), `action="/signin"`) {
		t.Errorf("the admin console after signing in as admin: %s\n%s", resp.Status, lastLines(string(b), 10))
	}
}

// upgradeAndRemove upgrades the package to a later version of itself and
// removes it, with the maintainer scripts seeing a systemd that records
// what they ask of it.
func upgradeAndRemove(t *testing.T, deb, version string) {
	t.Helper()
	next := version + ".1"
	nextDeb := filepath.Join(t.TempDir(), "deskway_next.deb")
	mk := exec.Command("go", "run", "./tools/mkdeb", "-bin", "bin", "-version", next, "-out", nextDeb)
	mk.Dir = ".."
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("mkdeb %s: %v\n%s", next, err, out)
	}
	keep := map[string][]byte{}
	for _, f := range []string{"/etc/deskway/token.key", "/etc/deskway/admin.token", "/etc/deskway/tls.key", "/etc/deskway/admin.password"} {
		keep[f], _ = os.ReadFile(f)
	}
	cfg, _ := os.ReadFile("/etc/deskway/deskway.yaml")
	edited := string(cfg) + "# edited by the operator\n"
	os.WriteFile("/etc/deskway/deskway.yaml", []byte(edited), 0o640)

	// deskway.service runs; deskway-gateway.service is enabled but
	// stopped (as a package whose prerm stopped units on upgrade leaves
	// it); the others are neither.
	calls, out := fakeSystemd(t, []string{"deskway.service"}, []string{"deskway-gateway.service"}, nil, "dpkg -i "+nextDeb)
	for _, c := range calls {
		if strings.HasPrefix(c, "stop") {
			t.Errorf("the upgrade stopped units: systemctl %s (calls: %q)", c, calls)
		}
	}
	var restarted []string
	for _, c := range calls {
		if u, ok := strings.CutPrefix(c, "restart "); ok {
			restarted = append(restarted, u)
		}
	}
	if !slices.Contains(calls, "--system daemon-reload") || strings.Join(restarted, " ") != "deskway.service deskway-gateway.service" {
		t.Errorf("after the upgrade, systemctl was asked %q; want daemon-reload and restart of deskway.service and deskway-gateway.service only", calls)
	}
	if strings.Contains(out, "What next") {
		t.Errorf("the upgrade ran deskway init as on a first install:\n%s", out)
	}
	if v, _ := exec.Command("dpkg-query", "-W", "-f", "${Version}", "deskway").Output(); string(v) != next {
		t.Fatalf("after the upgrade the package is %q, not %s", v, next)
	}
	for f, b := range keep {
		if now, _ := os.ReadFile(f); string(now) != string(b) {
			t.Errorf("the upgrade replaced %s", f)
		}
	}
	if now, _ := os.ReadFile("/etc/deskway/deskway.yaml"); string(now) != edited {
		t.Error("the upgrade lost the operator's edit of /etc/deskway/deskway.yaml")
	}

	calls, _ = fakeSystemd(t, []string{"deskway.service"}, nil, nil, "dpkg -r deskway")
	want := "stop " + strings.Join(packageUnits(), " ")
	if !slices.Contains(calls, want) {
		t.Errorf("dpkg -r asked systemctl %q; want %q", calls, want)
	}
}
