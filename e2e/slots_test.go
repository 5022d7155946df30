package e2e

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// slotsEnv names the variable TestMain sets to how many work slots the
// run's parallel tests share: the -parallel go test was given.
const slotsEnv = "DESKWAY_E2E_SLOTS"

// takeOverParallel hands go test's -parallel limit to the work slots:
// it records the limit asked for in slotsEnv and lifts go test's own, so
// that every parallel test starts its wait at once and parallel calls
// decide who runs. go test lets paused parallel tests go in whatever
// order its scheduler wakes them; in one run TestXRDP, the longest by
// far (its cases run one after another, 9 to 14 minutes), began 7
// minutes into the parallel part and ran alone for the last 9. TestXRDP
// and TestXRDPBeside take no work slot, so in a run of the whole package
// they start as soon as the serial tests end and run beside the tests
// sharing the slots (make test runs them in a process of their own). Parallel subtests, which
// take no work slot, are few and small (three Secure Boot machines, two
// stream liveness cases). It returns the run's slot lock names.
func takeOverParallel(dir string) ([]string, error) {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.parallel")
	if f == nil {
		return nil, fmt.Errorf("no -test.parallel flag")
	}
	n, err := strconv.Atoi(f.Value.String())
	if err != nil || n < 1 {
		return nil, fmt.Errorf("-test.parallel %q: %v", f.Value.String(), err)
	}
	if err := os.Setenv(slotsEnv, strconv.Itoa(n)); err != nil {
		return nil, err
	}
	if err := f.Value.Set("1000"); err != nil {
		return nil, err
	}
	return slotLocks(dir, n), nil
}

// slotLocks names the run's n work slot locks after its folder, as
// buildLocks does: another run on the machine has slots of its own.
func slotLocks(dir string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("e2e-work-%s-%d", filepath.Base(dir), i)
	}
	return names
}

// parallel is t.Parallel for a top-level test, then a wait for one of
// the run's work slots, held until t ends (released after every cleanup
// registered later). A test calls it first, where it would call
// t.Parallel.
func parallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	n, err := strconv.Atoi(os.Getenv(slotsEnv))
	bin := os.Getenv(binEnv)
	if err != nil || bin == "" {
		t.Fatal(slotsEnv + " or " + binEnv + " is unset: TestMain did not run")
	}
	takeOne(t, slotLocks(filepath.Dir(bin), n), "a work slot")
}

// TestWorkSlotsHoldTheLimit: tests calling parallel never run more than
// the work slots' number at once, and do reach it, with go test's own
// limit lifted so that a test taking no slot (TestXRDP) need not wait
// for theirs.
func TestWorkSlotsHoldTheLimit(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv(slotsEnv))
	if err != nil {
		t.Fatal(slotsEnv + " is unset: TestMain did not run")
	}
	if got := flag.Lookup("test.parallel").Value.String(); got != "1000" {
		t.Fatalf("go test's -parallel is %s, want it lifted to 1000", got)
	}
	var mu sync.Mutex
	running, most := 0, 0
	t.Run("tests", func(t *testing.T) {
		for i := range n + 4 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				parallel(t)
				mu.Lock()
				running++
				most = max(most, running)
				mu.Unlock()
				time.Sleep(300 * time.Millisecond)
				mu.Lock()
				running--
				mu.Unlock()
			})
		}
	})
	if most != n {
		t.Errorf("%d tests held work slots at once, want %d", most, n)
	}
}
