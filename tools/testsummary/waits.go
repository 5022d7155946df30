package main

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"
)

// waitLine is what a test logs when it waited for a machine-wide lock
// (testkit's Lock and LockDuring) or a guest slot (e2e's guests).
var waitLine = regexp.MustCompile(`waited (\S+) for (?:a guest slot|lock (\S+))`)

// lockWaits adds up how long parallel tests waited for shared locks: time
// in which they held one of go test's -parallel slots and did nothing.
type lockWaits struct {
	tests map[string]map[string]time.Duration // package.top-level test -> lock -> wait
	names map[string]string                   // package.top-level test -> top-level test
}

// add reads one line of test output of e.
func (l *lockWaits) add(e event) {
	m := waitLine.FindStringSubmatch(e.Output)
	if m == nil {
		return
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		return
	}
	lock := m[2]
	if lock == "" || strings.HasPrefix(lock, "e2e-guest-") {
		lock = "guest slots"
	}
	top, _, _ := strings.Cut(e.Test, "/")
	key := e.Package + "." + top
	if l.tests == nil {
		l.tests, l.names = map[string]map[string]time.Duration{}, map[string]string{}
	}
	l.names[key] = top
	if l.tests[key] == nil {
		l.tests[key] = map[string]time.Duration{}
	}
	l.tests[key][lock] += d
}

// print writes one line for the waits of the tests that ran in parallel
// (those in paused), the locks' totals and the three longest waiters.
func (l *lockWaits) print(w io.Writer, paused map[string]bool) {
	byLock := map[string]time.Duration{}
	type waiter struct {
		test string
		d    time.Duration
	}
	var waiters []waiter
	var total time.Duration
	for test, locks := range l.tests {
		if !paused[test] {
			continue // a serial test waiting holds no slot another could use
		}
		var sum time.Duration
		for lock, d := range locks {
			byLock[lock] += d
			sum += d
		}
		total += sum
		waiters = append(waiters, waiter{l.names[test], sum})
	}
	if total == 0 {
		return
	}
	var locks []string
	for lock, d := range byLock {
		locks = append(locks, fmt.Sprintf("%s %s", lock, d.Round(time.Second)))
	}
	sort.Strings(locks)
	sort.Slice(waiters, func(i, j int) bool { return waiters[i].d > waiters[j].d })
	var longest []string
	for _, x := range waiters[:min(len(waiters), 3)] {
		longest = append(longest, fmt.Sprintf("%s %s", x.test, x.d.Round(time.Second)))
	}
	fmt.Fprintf(w, "\nparallel tests waited %s for shared locks, each holding a -parallel slot (%s; longest %s)\n",
		total.Round(time.Second), strings.Join(locks, ", "), strings.Join(longest, ", "))
}
