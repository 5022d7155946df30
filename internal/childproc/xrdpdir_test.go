package childproc

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A socket directory made under the usual umask must still let the
// session's X server, running as the user, create its socket.
func TestPrepareXRDPSocketDirIsWorldWritableAndSticky(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	for _, existing := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "xrdp", "sockdir")
		if existing {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := PrepareXRDPSocketDir(dir); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fi.Mode()&(os.ModePerm|os.ModeSticky), 0o777|os.ModeSticky; got != want {
			t.Errorf("existing=%v: mode %v, want %v", existing, got, want)
		}
	}
}
