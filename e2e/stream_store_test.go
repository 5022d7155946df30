package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
	"github.com/deskway/deskway/internal/testkit"
)

const copyConfig = `state_dir: %[1]s
log: {level: debug, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
tls: {cert: %[3]s, key: %[4]s}
stream:
  listen: "127.0.0.1:%[5]d"
  tls: "off"
  clients: open
  vdisks:
  - {name: personal, base: %[6]s, mode: private, clients: [alice]}
`

// TestStreamPartialCopiesRemovedAtStart: a server killed while it makes
// a client's private image on first use leaves the copy in progress
// (hundreds of MB) in the store. The next start removes it, but leaves a
// copy another server on the shared store is still making.
func TestStreamPartialCopiesRemovedAtStart(t *testing.T) {
	parallel(t)
	testkit.Require(t, "qemu-io")
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "personal.img")
	f, err := os.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	// All data, no holes: the copy takes long enough to be caught at it.
	chunk := bytes.Repeat([]byte("personal image "), 1<<16)
	for written := 0; written < 768<<20; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	_, _, cert, key := testkit.TLS(t)
	ports := testkit.FreePorts(t, 2)
	cfg := filepath.Join(dir, "deskway.yaml")
	state := filepath.Join(dir, "state")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(copyConfig, state, ports[1], cert, key, ports[0], base)), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	start := func() *testkit.Process {
		p := testkit.Start(t, nil, bin, "stream", "-c", cfg)
		if err := testkit.WaitPort(addr, 10*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, p.Log.String())
		}
		return p
	}
	srv := start()
	private := filepath.Join(state, "vdisks", "private", "personal")
	copies := func() []string {
		m, _ := filepath.Glob(filepath.Join(private, ".copy-*"))
		return m
	}
	allocated := func(path string) int64 {
		var st syscall.Stat_t
		_ = syscall.Stat(path, &st)
		return st.Blocks * 512
	}
	// alice's first connection makes her image; the server dies mid-copy.
	client := exec.Command("qemu-io", "-f", "raw", "-r", "-c", "read 0 4096", "nbd://"+addr+"/personal/alice")
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	defer client.Process.Kill()
	deadline := time.Now().Add(20 * time.Second)
	for c := copies(); len(c) == 0 || allocated(c[0]) < 16<<20; c = copies() {
		if time.Now().After(deadline) {
			t.Fatalf("the first-use copy never started:\n%s", srv.Log.String())
		}
		time.Sleep(time.Millisecond)
	}
	_ = syscall.Kill(-srv.Cmd.Process.Pid, syscall.SIGKILL)
	_, _ = srv.Cmd.Process.Wait()
	_ = client.Wait()
	left := copies()
	if len(left) != 1 {
		t.Fatalf("the killed server left %d copies in progress, want the one it was making", len(left))
	}
	if _, err := os.Stat(filepath.Join(private, "alice.img")); err == nil {
		t.Fatal("the copy finished before the server was killed: make the base image bigger")
	}
	t.Logf("the killed server left %s, %d MiB", filepath.Base(left[0]), allocated(left[0])>>20)

	// A copy another server sharing the store is making right now.
	busy, err := os.Create(filepath.Join(private, ".copy-inprogress"))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if err := syscall.Flock(int(busy.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	srv = start()
	if got := copies(); len(got) != 1 || got[0] != busy.Name() {
		t.Fatalf("after a restart the copies in progress are %v, want only the one still being made (%s)", got, busy.Name())
	}
	if !strings.Contains(srv.Log.String(), "removed partial copies") {
		t.Fatalf("the removal was not logged:\n%s", srv.Log.String())
	}
	// alice's image is made afresh, whole.
	if ok, out := qemuIO(t, "nbd://"+addr+"/personal/alice", true, "read -P 0x70 0 1"); !ok {
		t.Fatalf("alice's image after the restart:\n%s", out)
	}
}

// TestStreamMadeUpPrivateNamesLeaveNothing: with stream.clients open
// anyone can name any client; a name with no private image is refused
// without anything made on disk for it (each used to leave a lock file,
// without bound).
func TestStreamMadeUpPrivateNamesLeaveNothing(t *testing.T) {
	parallel(t)
	r := startStream(t, "off", "1m")
	files := func() map[string]bool {
		m := map[string]bool{}
		_ = filepath.WalkDir(filepath.Join(r.dir, "state"), func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				m[p] = true
			}
			return nil
		})
		return m
	}
	before := files()
	const names = 200
	for i := range names {
		raw, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = nbdclient.Handshake(raw, fmt.Sprintf("personal/madeup%d", i), nbdclient.Options{})
		raw.Close()
		var oe *nbdclient.OptionError
		if !errors.As(err, &oe) || oe.Type != nbd.RepErrPolicy || !strings.Contains(oe.Message, "has no private image") {
			t.Fatalf("made-up name %d: want a refusal saying it has no private image, got %v", i, err)
		}
	}
	var left []string
	for p := range files() {
		if !before[p] {
			left = append(left, p)
		}
	}
	if len(left) != 0 {
		t.Fatalf("%d made-up client names left %d files in the store: %v", names, len(left), left[:min(len(left), 5)])
	}
	// A listed client still gets its image on first use.
	if ok, out := qemuIO(t, r.uri+"/personal/alice", true, "read 0 4096"); !ok {
		t.Fatalf("alice's first use:\n%s", out)
	}
}
