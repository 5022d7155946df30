package e2e

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// guestSlots is how many emulated guests the tests run at once. Where
// KVM runs no guest, qemu emulates the CPU and each guest keeps a core
// busy while it boots: two on this 2-core machine.
const guestSlots = 2

// guestTest is parallel for a test that boots guests: t.Parallel, and
// no work slot. Its guests wait for the guest slots (guests), which bound
// such tests by themselves; holding a work slot while it waited for
// them, a guest test kept the tests that boot none from running (in one
// clean-clone run, 11 minutes of waits for guest slots, each holding a
// work slot). Its setup before the guests (images, servers) runs at
// once, beside the others'.
func guestTest(t *testing.T) {
	t.Helper()
	t.Parallel()
}

// guests takes one of the machine's guest slots for the rest of t, or
// all of them when n is more than one, waiting until they are free. A
// parallel test calls it before it boots a guest, with the most guests
// it runs at once, so that the guests of tests running side by side
// never outnumber the slots. Slots are file locks (testkit.LockFile), so
// they hold across test processes too, and are released when t ends,
// after the cleanups registered later (the guests are stopped first).
// A test taking every slot takes them in order, so two such tests never
// hold one each and wait for the other's.
func guests(t *testing.T, n int) {
	t.Helper()
	takeGuestSlots(t, "e2e-guest", n)
}

// takeGuestSlots is guests with the slots' locks named prefix-0,
// prefix-1...
func takeGuestSlots(t *testing.T, prefix string, n int) {
	t.Helper()
	names := make([]string, guestSlots)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	if n > 1 {
		testkit.Lock(t, names...)
		return
	}
	takeOne(t, names, "a guest slot")
}

// takeOne waits until it holds one of the named locks, for the rest of
// t, trying each in turn; a wait of over a second is logged as "waited
// D for what" (testsummary reads it).
func takeOne(t *testing.T, names []string, what string) {
	t.Helper()
	start := time.Now()
	for {
		for _, name := range names {
			if release, ok := tryLock(t, name); ok {
				if waited := time.Since(start); waited > time.Second {
					t.Logf("waited %s for %s", waited.Round(time.Second), what)
				}
				t.Cleanup(release)
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tryLock takes the named lock if no one holds it.
func tryLock(t *testing.T, name string) (release func(), ok bool) {
	t.Helper()
	f, err := os.OpenFile(testkit.LockFile(name), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatalf("lock %s: %v", name, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return func() { f.Close() }, true
}

// TestGuestSlotsHoldTwoGuests: tests taking guest slots side by side
// never hold more than two guests' worth at once, a test taking both
// counting as two; and they do take turns rather than wait forever. The
// slots are its own: the machine's are the guest tests', which run
// beside it (scripts/test.sh).
func TestGuestSlotsHoldTwoGuests(t *testing.T) {
	prefix := fmt.Sprintf("e2e-guest-check-%d", os.Getpid())
	t.Cleanup(func() {
		for i := range guestSlots {
			_ = os.Remove(testkit.LockFile(fmt.Sprintf("%s-%d", prefix, i)))
		}
	})
	var mu sync.Mutex
	held, most := 0, 0
	t.Run("tests", func(t *testing.T) {
		for i, n := range []int{1, 2, 1, 1, 2, 1, 2, 2} {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				takeGuestSlots(t, prefix, n)
				mu.Lock()
				held += min(n, guestSlots)
				most = max(most, held)
				mu.Unlock()
				time.Sleep(50 * time.Millisecond) // a guest's boot, in short
				mu.Lock()
				held -= min(n, guestSlots)
				mu.Unlock()
			})
		}
	})
	if most > guestSlots {
		t.Errorf("%d guests' worth of slots held at once, want at most %d", most, guestSlots)
	}
}

// TestGuestTestsRunApart: scripts/test.sh runs the tests that boot
// guests in a go test process of their own, named in its GUESTS pattern,
// and the rest of the package in another, which skips them. Every test
// that calls guestTest matches the pattern, and nothing else does, so
// no test runs twice, in neither, or boots its guests where the serial
// tests would hold them back.
func TestGuestTestsRunApart(t *testing.T) {
	script, err := os.ReadFile("../scripts/test.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^GUESTS='([^']+)'$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("scripts/test.sh sets no GUESTS='...' pattern")
	}
	pattern := regexp.MustCompile(string(m[1]))
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	tests := 0
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			tests++
			boots := slices.ContainsFunc(fn.Body.List, func(s ast.Stmt) bool {
				e, ok := s.(*ast.ExprStmt)
				if !ok {
					return false
				}
				c, ok := e.X.(*ast.CallExpr)
				if !ok {
					return false
				}
				id, ok := c.Fun.(*ast.Ident)
				return ok && id.Name == "guestTest"
			})
			if boots != pattern.MatchString(fn.Name.Name) {
				t.Errorf("%s (%s): calls guestTest %v, matches scripts/test.sh's GUESTS %v", fn.Name.Name, f, boots, !boots)
			}
		}
	}
	if tests < 100 {
		t.Fatalf("found %d tests in the package's files, want them all", tests)
	}
}
