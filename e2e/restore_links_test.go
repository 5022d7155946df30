package e2e

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/testkit"
)

// TestRestoreFollowsNoLinkInTheStateDirectory: deskway restore runs as
// root in a state directory its broker's user owns, so whatever runs as
// that user (a compromised broker) can put links there. A link at the
// lock file, or one swapped in for the restore's temporary file the
// moment it appears, must not make root create, write, chmod or chown
// the file it points to.
func TestRestoreFollowsNoLinkInTheStateDirectory(t *testing.T) {
	testkit.RequireRoot(t)
	testkit.Require(t, "setpriv")
	r := newNobodysBroker(t, "deskway-restore-links-")
	nobody, bin, state, cfg, brokerPort := r.nobody, r.bin, r.state, r.cfg, r.brokerPort
	// Root's own files, in a directory only root reaches.
	secret := t.TempDir()
	victim := filepath.Join(secret, "victim")
	if err := os.WriteFile(victim, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	emptyVictim := filepath.Join(secret, "empty-victim")
	if err := os.WriteFile(emptyVictim, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	untouched := func(what, path string) {
		t.Helper()
		st, err := os.Lstat(path)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Uid != 0 || sys.Gid != 0 || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: root's %s is now %d:%d %v", what, path, sys.Uid, sys.Gid, st.Mode().Perm())
		}
		if path == emptyVictim && st.Size() != 0 {
			t.Fatalf("%s: root wrote %d bytes into %s", what, st.Size(), path)
		}
	}

	// A broker made the database as its user and stopped; root backed it up.
	broker := testkit.Start(t, nil, "setpriv", "--reuid", nobody.Uid, "--regid", nobody.Gid, "--clear-groups", "--", bin, "broker", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", brokerPort), 20*time.Second); err != nil {
		t.Fatalf("the broker did not listen: %v\n%s", err, broker.Log.String())
	}
	stopProcess(t, broker)
	backup := filepath.Join(t.TempDir(), "broker.db")
	restore := func() (string, error) {
		out, err := exec.Command(bin, "restore", "-c", cfg, backup).CombinedOutput()
		return string(out), err
	}
	if out, err := exec.Command(bin, "backup", "-c", cfg, backup).CombinedOutput(); err != nil {
		t.Fatalf("backup: %v\n%s", err, out)
	}

	// The lock file a link to a file of root's, then to where none is.
	lock := filepath.Join(state, "broker.db.lock")
	if err := os.Remove(lock); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, lock); err != nil {
		t.Fatal(err)
	}
	out, _ := restore()
	untouched("lock file linked to a file of root's", victim)
	if strings.Contains(out, "restored") {
		t.Fatalf("the restore went on over a linked lock file:\n%s", out)
	}
	planted := filepath.Join(secret, "planted")
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(planted, lock); err != nil {
		t.Fatal(err)
	}
	_, _ = restore()
	if _, err := os.Lstat(planted); err == nil {
		t.Fatalf("root created %s through a link at the lock file", planted)
	}
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}

	// The temporary file swapped for a link to an empty file of root's
	// as soon as it appears, as inotify lets its directory's owner do.
	swaps := swapOnCreate(t, state, ".broker.db.restore-", emptyVictim)
	for i := 0; i < 10; i++ {
		_, _ = restore()
		untouched(fmt.Sprintf("restore %d with its temporary file swapped for a link", i+1), emptyVictim)
	}
	if swaps() == 0 {
		t.Fatal("the temporary file was never swapped: the attack did not run")
	}
}

// swapOnCreate renames every file made in dir whose name starts with
// prefix away the moment inotify reports it, and puts a link to target
// in its place, as the directory's owner can. The returned function
// stops it and says how many it swapped.
func swapOnCreate(t *testing.T, dir, prefix, target string) func() int {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	stop := make(chan struct{})
	swapped := make(chan int, 1)
	go func() {
		swaps := 0
		defer func() { swapped <- swaps }()
		done := map[string]bool{} // the link made in its place is created too
		buf := make([]byte, 64<<10)
		for {
			k, err := unix.Read(fd, buf)
			if err != nil || k <= 0 {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= k; {
				// struct inotify_event: wd, mask, cookie, len, then the name.
				n := int(binary.NativeEndian.Uint32(buf[off+12:]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+n]), "\x00")
				off += unix.SizeofInotifyEvent + n
				if !strings.HasPrefix(name, prefix) || strings.HasSuffix(name, ".moved") || done[name] {
					continue
				}
				done[name] = true
				p := filepath.Join(dir, name)
				if os.Rename(p, p+".moved") == nil && os.Symlink(target, p) == nil {
					swaps++
				}
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	return func() int {
		// One more event wakes the reader to see stop.
		close(stop)
		_ = os.WriteFile(filepath.Join(dir, "wake"), nil, 0o600)
		n := <-swapped
		unix.Close(fd)
		_ = os.Remove(filepath.Join(dir, "wake"))
		return n
	}
}
