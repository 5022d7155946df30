// Package e2e drives deskway with real third-party programs (xrdp,
// xfreerdp, chromium, qemu, PostgreSQL, HAProxy, FRR, ...), each started
// by the test that needs it, on loopback or in network namespaces the
// test makes.
//
// How the tests share the machine (make test runs them with -parallel
// $(TEST_PARALLEL); the Makefile says why that many):
//
//   - A test that only waits on its own servers, on ports the kernel
//     chose (testkit.FreePort) and namespaces with random names, calls
//     parallel(t) first: t.Parallel, then a wait for one of the run's
//     $(TEST_PARALLEL) work slots (TestMain takes go test's -parallel
//     over for them; slots_test.go says why).
//   - A test that needs a resource of the whole machine also calls
//     testkit.Lock with its name, right after parallel(t): an xrdp
//     setup (testkit.LockSesman for the machine's own, sesman on port
//     3350; testkit.StartXRDP and testkit.NewXRDPNamespace take a
//     setup's lock themselves; a test whose deskway agent reads every
//     xrdp session on the machine, such as make run's or a bench's,
//     takes every setup's), the fixed service ports
//     8443/8444/8446/9443/10809/3389 on the host
//     (testkit.LockServicePorts). Locks are files under os.TempDir(), so
//     they hold across test processes too.
//   - A test that measures time against a budget (a failover within 3 s,
//     a bench's figures) or loads both CPUs for long does not call
//     t.Parallel(): go test runs such tests one by one before any
//     parallel test starts, so nothing of this package runs beside them
//     but, in make test, the guest tests and the two chains of xrdp
//     cases, each in a process of their own (below).
//   - The fault tests split along that line. Those whose checks hold
//     whatever the timings (the stream, link-stream, broker and clock
//     cases: no write lost, no launch doubled, every fresh token refused)
//     spend about a tenth of their wall time on CPU and call
//     parallel(t); those that hold a budget (the link cut's write
//     timeout, the link agent's heartbeat timeout, the disk's 5 s, the
//     gateway node's 10 s) stay serial: TestFaultsLinkCut missed its
//     write-timeout budget at a load of 38 even alone. The link agent's
//     case runs with a heartbeat timeout of 10 s at the test's scale
//     (30 s in the bench): the broker reads staleness from the last
//     heartbeat at each request, so a shorter timeout checks the same.
//   - The bench smokes split the same way: those that check their
//     result's shape and nothing of its figures, on servers at ports the
//     kernel chose, and wait more than they compute (the boot storm's,
//     the broker's, the site's in its own namespaces) call parallel(t),
//     the netboot one's guestTest(t); those that drive xrdp (the browser's, the time to
//     first frame's) are cases of TestXRDP (below), the session host's
//     (a ramp of xrdp sessions that loads both cores) and the gateway's
//     (which judges its tunnels answered in every window beside
//     HAProxy's) stay serial. The session host's runs its --suggest-limit
//     check in the same run as its broker ramp: one rig, started once.
//   - Tests that boot qemu guests run in parallel, each in namespaces of
//     its own, and share the guest slots (guests); make test runs them
//     in a go test process of their own from the start, beside the
//     serial tests of the rest (scripts/test.sh's GUESTS); they call
//     guestTest(t), which takes no work slot, in place of parallel(t),
//     since the guest slots bound them already: where KVM runs no
//     guest, qemu emulates the CPU and each guest takes a core, so the
//     machine runs two at a time. A test booting one guest at a time
//     takes one slot; one booting two or more at once (the UEFI and
//     menu tests, the root-over-NBD and bare-VM tests, the stream's two
//     VMs) takes both, and so runs beside tests that boot none, never
//     beside another guest (at a load of 19, beside another guest test,
//     TestNetbootUEFI's two UEFI guests once missed their 2-minute wait).
//     (TestNetbootSecureBoot's three machines boot beside each other
//     on its two slots.)
//   - The package and image tests (TestDebianPackage, TestContainerImage,
//     TestContainerImageSystemRoots, TestHelmChart, TestREADMEQuickstart)
//     judge no timing and call parallel(t): each builds into a folder of
//     its own or holds lockRepoBin while a make target writes the
//     repository's bin/deskway (make deb, make run), and the service
//     ports and sesman locks as before.
//   - The tests that start xrdp (with xfreerdp, chromium or a bench
//     driving it: the browser and ttff bench smokes too) are the cases
//     of two parallel tests, TestXRDP and TestXRDPBeside, each running
//     its cases one after another on an xrdp setup of its own
//     (testkit.XRDPSetup), and neither takes a work slot: the run's
//     longest tests, they start with the parallel part. TestXRDP's
//     setup is the machine's configuration (sesman on port 3350),
//     TestXRDPBeside's a copy of it with sesman on port 3351, X displays
//     from :200 and the account dwtest2.
//     A case's xrdp, sesman, sessions and deskway agent run in a mount
//     and PID namespace of the case's (testkit.XRDPNamespace): xrdp
//     reads sesman's port from /etc/xrdp/sesman.ini, a path compiled
//     in, which the second setup's namespace binds its copy over, and
//     the agent counts every X server an xrdp-sesman started as a
//     session of its host, which in its namespace are its own case's.
//     As parallel tests of their own, one waiting for its setup's lock
//     would hold a -parallel slot doing nothing. make test runs the
//     two in a test process of their own from the start
//     (scripts/test.sh's XRDP): as parallel tests of the whole
//     package's run they could only start when all of its serial tests
//     had ended. The serial tests that drive xrdp (the session host's
//     bench smoke, the gateway node's fault) take both setups' locks,
//     so each waits for the case at hand on either, and no case runs
//     beside them. They judge no time but
//     their own deadlines for what a person would see, and mostly wait
//     (alone, a case spends a seventh to a quarter of its wall time on
//     CPU, chromium and xrdp's sessions included), so the two run beside
//     each other and the other parallel tests. Select a case by its
//     name in either: -run 'TestXRDP/BrowserDesktop$' matches both
//     tests' names. The chromium tests without
//     xrdp (the console's vDisk pages, the portal's identity providers)
//     call parallel(t) themselves; deskway's boot services listen on
//     TFTP's fixed port 69, so each of their deskways boots on a
//     loopback address of its own (bootAddr).
//
// Every test gets the deskway binary from build(t): it is compiled once
// per run and shared, so a test must not change or remove it.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/deskway/deskway/internal/testkit"
)

// binEnv names the variable TestMain sets to the path build compiles
// the deskway binary to: the one value every test of the run shares.
const binEnv = "DESKWAY_E2E_BIN"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deskway-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	if err := os.Setenv(binEnv, filepath.Join(dir, "deskway")); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	slots, err := takeOverParallel(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	for _, lock := range append(buildLocks(dir), slots...) {
		_ = os.Remove(testkit.LockFile(lock))
	}
	os.Exit(code)
}

// build returns the deskway binary. The first test to ask compiles it
// (about 10 s of CPU for the link alone, which each test paid before);
// the rest of the run shares it, tests running in parallel waiting for
// that first build.
func build(t *testing.T) string {
	t.Helper()
	bin := os.Getenv(binEnv)
	if bin == "" {
		t.Fatal(binEnv + " is unset: TestMain did not run")
	}
	if _, err := os.Stat(bin); err == nil {
		return bin // renamed into place whole
	}
	testkit.LockDuring(t, buildLocks(filepath.Dir(bin))[0], func() {
		if _, err := os.Stat(bin); err == nil {
			return
		}
		// Built beside its final name and renamed, so no test ever sees
		// half a binary.
		cmd := exec.Command("go", "build", "-o", bin+".new", "../cmd/deskway")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		if err := os.Rename(bin+".new", bin); err != nil {
			t.Fatal(err)
		}
	})
	return bin
}

// buildLocks names the locks under which build and buildNbdroot link
// the binaries of the run whose folder is dir. They are named after the
// run: the test processes of other runs on the machine link binaries of
// their own and need not wait for this one's.
func buildLocks(dir string) []string {
	return []string{"e2e-build-" + filepath.Base(dir), "e2e-build-nbdroot-" + filepath.Base(dir)}
}
