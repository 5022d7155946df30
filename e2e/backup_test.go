package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// backupConfig is a broker alone, on SQLite in its state directory.
const backupConfig = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: [admin-tok]}
auth:
  token_key: backup-test-key-0123456789abcdef0123456789
broker:
  listen: "127.0.0.1:%[3]d"
  gateway: "gateway.example.test:443"
  delivery_groups:
  - {name: desk, groups: [staff]}
`

// TestBrokerBackupAndRestore runs docs/operations.md's SQLite backup and
// restore lines as written, with only the paths changed, as root, while
// the broker runs as another user (nobody, as the package's broker runs
// as deskway) on a state directory that user owns. A host registered and
// drained is backed up from the running broker; a restore while it runs
// is refused with a sentence; the broker is stopped and its database
// deleted, then restored; the broker starts again as its user, the host
// and its drain are back, and the broker can write (undrain).
func TestBrokerBackupAndRestore(t *testing.T) {
	testkit.RequireRoot(t)
	testkit.Require(t, "setpriv")
	r := newNobodysBroker(t, "deskway-backup-")
	nobody, uid, gid, bin, state, cfg, brokerPort := r.nobody, r.uid, r.gid, r.bin, r.state, r.cfg, r.brokerPort

	backupLine, restoreLine := documentedLines(t)
	backupFile := filepath.Join(t.TempDir(), "broker.db")
	fill := strings.NewReplacer("/etc/deskway/deskway.yaml", cfg, "/backup/broker.db", backupFile)

	startBroker := func() *testkit.Process {
		t.Helper()
		p := testkit.Start(t, nil, "setpriv", "--reuid", nobody.Uid, "--regid", nobody.Gid, "--clear-groups", "--", bin, "broker", "-c", cfg)
		if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", brokerPort), 20*time.Second); err != nil {
			t.Fatalf("the broker did not listen: %v\n%s", err, p.Log.String())
		}
		return p
	}
	deskway := func(args ...string) (string, error) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := deskway(args...)
		if err != nil {
			t.Fatalf("deskway %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	// runLine runs a documented line, its paths filled in.
	runLine := func(line string) (string, error) {
		f := strings.Fields(fill.Replace(line))
		if f[0] != "deskway" {
			t.Fatalf("the documented line %q does not start with deskway", line)
		}
		return deskway(f[1:]...)
	}

	broker := startBroker()
	join := strings.TrimSpace(must("token", "join", "-c", cfg, "--group", "desk", "--uses", "1"))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/agent/register", brokerPort),
		strings.NewReader(`{"name":"h1","address":"127.0.0.1","port":3389}`))
	req.Header.Set("Authorization", "Bearer "+join)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("register: %s %s", resp.Status, body)
	}
	must("host", "drain", "h1", "-c", cfg)
	drained := regexp.MustCompile(`(?m)^h1\s.*draining`)
	if out := must("host", "ls", "-c", cfg); !drained.MatchString(out) {
		t.Fatalf("host ls after drain:\n%s", out)
	}

	// Backed up while the broker runs.
	if out, err := runLine(backupLine); err != nil || !strings.Contains(out, "backed up") {
		t.Fatalf("%s: %v\n%s", backupLine, err, out)
	}
	// Restoring over the running broker is refused, in a sentence.
	out, err := runLine(restoreLine)
	if err == nil {
		t.Fatalf("%s while the broker runs succeeded:\n%s", restoreLine, out)
	}
	if !strings.Contains(out, "a broker is running on "+filepath.Join(state, "broker.db")+"; stop it first") || strings.Contains(out, "another process holds") {
		t.Fatalf("%s while the broker runs: %q, want a sentence saying a broker is running", restoreLine, out)
	}
	if out := must("host", "ls", "-c", cfg); !drained.MatchString(out) {
		t.Fatalf("the refused restore changed the running broker's hosts:\n%s", out)
	}

	// Stopped; the database is lost.
	stopProcess(t, broker)
	for _, f := range []string{"broker.db", "broker.db-wal", "broker.db-shm"} {
		if err := os.Remove(filepath.Join(state, f)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	if out, err := runLine(restoreLine); err != nil || !strings.Contains(out, "restored") {
		t.Fatalf("%s: %v\n%s", restoreLine, err, out)
	}
	for _, f := range []string{"broker.db", "broker.db.lock"} {
		st, err := os.Stat(filepath.Join(state, f))
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if int(sys.Uid) != uid || int(sys.Gid) != gid {
			t.Errorf("%s is %d:%d after the restore, want the state directory's %d:%d", f, sys.Uid, sys.Gid, uid, gid)
		}
		if f == "broker.db" && st.Mode().Perm() != 0o640 {
			t.Errorf("broker.db has mode %v after the restore, want 0640", st.Mode().Perm())
		}
	}

	// Started again as its user: the host and its drain are back, and
	// the broker can write its database.
	startBroker()
	if out := must("host", "ls", "-c", cfg); !drained.MatchString(out) {
		t.Fatalf("host ls after the restore:\n%s", out)
	}
	must("host", "undrain", "h1", "-c", cfg)
	if out := must("host", "ls", "-c", cfg); drained.MatchString(out) || !strings.Contains(out, "h1") {
		t.Fatalf("host ls after undrain on the restored database:\n%s", out)
	}
}

// documentedLines are docs/operations.md's SQLite backup and restore
// command lines.
func documentedLines(t *testing.T) (backup, restore string) {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	find := func(verb string) string {
		m := regexp.MustCompile("`(deskway " + verb + " [^`]+)`").FindSubmatch(b)
		if m == nil {
			t.Fatalf("docs/operations.md shows no deskway %s line", verb)
		}
		return string(m[1])
	}
	return find("backup"), find("restore")
}

// stopProcess ends p as systemctl stop would, and waits for it.
func stopProcess(t *testing.T, p *testkit.Process) {
	t.Helper()
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("the process did not stop on SIGTERM\n%s", p.Log.String())
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

// nobodysBroker is a broker laid out as the package lays it out: the
// binary and the configuration in a directory anyone may read, the state
// directory owned by the user the broker runs as (nobody here, deskway in
// the package), so that root's backup and restore meet its files as they
// would in production.
type nobodysBroker struct {
	nobody                *user.User
	uid, gid              int
	dir, bin, state, cfg  string
	adminPort, brokerPort int
}

func newNobodysBroker(t *testing.T, prefix string) *nobodysBroker {
	t.Helper()
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody")
	}
	r := &nobodysBroker{nobody: nobody}
	r.uid, _ = strconv.Atoi(nobody.Uid)
	r.gid, _ = strconv.Atoi(nobody.Gid)
	if r.dir, err = os.MkdirTemp("", prefix); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(r.dir) })
	if err := os.Chmod(r.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r.bin = filepath.Join(r.dir, "deskway")
	copyFile(t, build(t), r.bin, 0o755)
	r.state = filepath.Join(r.dir, "state")
	if err := os.Mkdir(r.state, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(r.state, r.uid, r.gid); err != nil {
		t.Fatal(err)
	}
	r.adminPort, r.brokerPort = testkit.FreePort(t), testkit.FreePort(t)
	r.cfg = filepath.Join(r.dir, "deskway.yaml")
	if err := os.WriteFile(r.cfg, []byte(fmt.Sprintf(backupConfig, r.state, r.adminPort, r.brokerPort)), 0o644); err != nil {
		t.Fatal(err)
	}
	return r
}
