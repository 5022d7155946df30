package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// quietGate runs the tests that judge time against a budget (quiet) one
// at a time, with no other test of the package beside them but the
// emulated guests of the guest tests, which it holds at the lowest
// priority meanwhile (nice 19: a busy guest then gets a few per cent of
// a core when a quiet test wants it, and whatever the quiet tests leave
// idle). They used to run serially, before go test starts any parallel
// test: alone for six minutes, the machine was less than half busy while
// the guest tests, the run's longest, waited to start.
//
// Every quiet test registers before its t.Parallel call, that is in go
// test's sequential phase, before any parallel test resumes: a parallel
// test that finds none pending knows that none will come.
type quietGate struct {
	mu      sync.Mutex
	done    *sync.Cond
	pending int        // quiet tests registered and not yet ended
	turn    sync.Mutex // held by the quiet test that runs
}

// gate is the package's one quiet gate: the tests of one process share
// it as they share the machine.
var gate = newQuietGate()

func newQuietGate() *quietGate {
	g := &quietGate{}
	g.done = sync.NewCond(&g.mu)
	return g
}

// guestNice is the niceness of the guests' emulators while quiet tests
// are pending.
const guestNice = 19

// quiet is t.Parallel for a top-level test that judges time against a
// budget or loads both CPUs for long: it then waits for its turn among
// such tests, while every other non-guest test waits for all of them to
// end. A test calls it first, where it would call t.Parallel.
func quiet(t *testing.T) {
	t.Helper()
	gate.quiet(t)
}

func (gate *quietGate) quiet(t *testing.T) {
	t.Helper()
	gate.mu.Lock()
	gate.pending++
	gate.mu.Unlock()
	t.Parallel()
	start := time.Now()
	gate.turn.Lock()
	if waited := time.Since(start); waited > time.Second {
		t.Logf("waited %s for its turn among the quiet tests", waited.Round(time.Second))
	}
	t.Cleanup(func() {
		gate.turn.Unlock()
		gate.mu.Lock()
		gate.pending--
		if gate.pending == 0 {
			gate.done.Broadcast()
		}
		gate.mu.Unlock()
	})
}

// afterQuiet waits until no quiet test is pending: a parallel test that
// boots no guest calls it once t.Parallel has returned.
func afterQuiet(t *testing.T) {
	t.Helper()
	gate.afterQuiet(t)
}

func (gate *quietGate) afterQuiet(t *testing.T) {
	t.Helper()
	start := time.Now()
	gate.mu.Lock()
	for gate.pending > 0 {
		gate.done.Wait()
	}
	gate.mu.Unlock()
	if waited := time.Since(start); waited > time.Second {
		t.Logf("waited %s for the quiet tests", waited.Round(time.Second))
	}
}

// guestsLowWhileQuiet keeps every thread of the guest emulator pid at
// nice guestNice while quiet tests are pending and at 0 once none is,
// until the emulator ends or t does. Threads are reniced one by one
// (a process's niceness on Linux is its threads'), again every half
// second for those qemu starts later.
func guestsLowWhileQuiet(t *testing.T, pid int) {
	t.Helper()
	gate.guestsLowWhileQuiet(t, pid)
}

func (gate *quietGate) guestsLowWhileQuiet(t *testing.T, pid int) {
	t.Helper()
	stop := make(chan struct{})
	ended := make(chan struct{})
	t.Cleanup(func() { close(stop); <-ended })
	renice := func() bool {
		gate.mu.Lock()
		nice := 0
		if gate.pending > 0 {
			nice = guestNice
		}
		gate.mu.Unlock()
		tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
		if err != nil {
			return false
		}
		for _, task := range tasks {
			if tid, err := strconv.Atoi(task.Name()); err == nil {
				_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice)
			}
		}
		return true
	}
	renice()
	go func() {
		defer close(ended)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if !renice() {
					return
				}
			}
		}
	}()
}

// TestQuietGateKeepsQuietTestsAlone: on a gate of its own, quiet tests
// run one at a time, a parallel test starts only once every quiet test
// has ended, and a stand-in guest runs at nice 19 while quiet tests are
// pending and at 0 after.
func TestQuietGateKeepsQuietTestsAlone(t *testing.T) {
	parallel(t)
	g := newQuietGate()
	guest := exec.Command("sleep", "60")
	if err := guest.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = guest.Process.Kill(); _ = guest.Wait() })
	var mu sync.Mutex
	var quietNow, quietMost, quietEnded, readersEarly int
	var niceWhileQuiet []int
	t.Run("tests", func(t *testing.T) {
		t.Run("guest", func(t *testing.T) {
			g.guestsLowWhileQuiet(t, guest.Process.Pid)
			t.Parallel()
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				mu.Lock()
				ended := quietEnded
				mu.Unlock()
				if ended == 3 {
					break
				}
			}
			time.Sleep(1200 * time.Millisecond) // two renice ticks

		})
		for i := range 3 {
			t.Run(fmt.Sprint("quiet", i), func(t *testing.T) {
				g.quiet(t)
				mu.Lock()
				quietNow++
				quietMost = max(quietMost, quietNow)
				mu.Unlock()
				time.Sleep(600 * time.Millisecond) // a renice tick comes by
				n := procNice(t, guest.Process.Pid)
				mu.Lock()
				niceWhileQuiet = append(niceWhileQuiet, n)
				quietNow--
				quietEnded++
				mu.Unlock()
			})
		}
		for i := range 3 {
			t.Run(fmt.Sprint("parallel", i), func(t *testing.T) {
				t.Parallel()
				g.afterQuiet(t)
				mu.Lock()
				if quietEnded < 3 {
					readersEarly++
				}
				mu.Unlock()
			})
		}
	})
	if quietMost != 1 {
		t.Errorf("%d quiet tests ran at once, want 1", quietMost)
	}
	if readersEarly != 0 {
		t.Errorf("%d parallel tests started before the quiet tests ended", readersEarly)
	}
	for _, n := range niceWhileQuiet {
		if n != guestNice {
			t.Errorf("the guest's nice while quiet tests ran: %v, want %d", niceWhileQuiet, guestNice)
			break
		}
	}
	if n := procNice(t, guest.Process.Pid); n != 0 {
		t.Errorf("the guest's nice once the quiet tests ended: %d, want 0", n)
	}
}

// procNice is the niceness of process pid's main thread (field 19 of
// /proc/pid/stat).
func procNice(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	n, err := strconv.Atoi(f[16])
	if err != nil {
		t.Fatal(err)
	}
	return n
}
