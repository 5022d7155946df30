package testkit

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// Names of the machine-wide resources tests hold with Lock. A test that
// uses one of them, directly or through a command it starts, takes its
// lock; tests that take none may run beside anything.
const (
	// LockSesman is MachineXRDP's: xrdp-sesman on port 3350, from the
	// machine's /etc/xrdp, so one such xrdp (a test's, make run's, a
	// bench's) runs at a time.
	LockSesman = "xrdp-sesman"
	// LockSesmanSecond is SecondXRDP's. A test whose programs read every
	// xrdp session on the machine (a deskway agent outside an
	// XRDPNamespace: make run's, a bench's) holds it with LockSesman.
	LockSesmanSecond = "xrdp-sesman-3351"
	// LockServicePorts: the ports the embedded defaults and the shipped
	// units listen on (8443, 8444, 8446, 9443, 10809, 3389).
	LockServicePorts = "service-ports"
)

// Lock takes the named locks for the rest of t: a test that holds one
// waits for no other holder of it, in this process or another (a file
// lock under os.TempDir(), so two `go test` runs on one machine keep
// out of each other's way too). The locks are taken in name order, so
// two tests taking overlapping sets cannot wait on each other; they are
// released when t ends, after the cleanups registered after Lock (so
// what the test started under a lock is stopped before the next holder
// starts). Call it after t.Parallel and before starting anything that
// needs the resource.
func Lock(t testing.TB, names ...string) {
	t.Helper()
	names = slices.Clone(names)
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		t.Cleanup(take(t, name))
	}
}

// LockDuring runs fn holding the named lock, and releases it when fn
// returns: for a step that one test at a time may take, such as building
// a binary the others then share.
func LockDuring(t testing.TB, name string, fn func()) {
	t.Helper()
	release := take(t, name)
	defer release()
	fn()
}

// take waits for the named lock and returns its release.
func take(t testing.TB, name string) (release func()) {
	t.Helper()
	f, err := os.OpenFile(LockFile(name), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatalf("lock %s: %v", name, err)
	}
	release = func() { f.Close() } // closing the file releases the lock
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
		return release
	}
	start := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("lock %s: %v", name, err)
	}
	t.Logf("waited %s for lock %s", time.Since(start).Round(time.Millisecond), name)
	return release
}

// LockFile is the file that holds the named lock: a run that names locks
// after itself removes their files when it ends.
func LockFile(name string) string {
	return filepath.Join(os.TempDir(), "deskway-test-"+name+".lock")
}
