// Command testsummary reads `go test -json` on stdin, or from the files
// named (the named pipes of go test runs side by side, merged line by
// line), prints each package
// result, the output of every failed test and of every package that did
// not build, and ends with one line: "N passed, N failed, N skipped",
// after the ten slowest tests, how long parallel tests sat waiting for
// shared locks (guest slots, xrdp-sesman's port) and the run's wall time
// (the suite's time budget is spent there, so a run says where). It exits 1 if anything
// failed, and, when CI is set, if anything was skipped: in CI every real
// peer must run, and a skipped test would be a check that silently did
// not happen. An e2e test's wait for one of its run's work slots comes
// before it starts, as go test's own wait for a -parallel slot does, and
// is not counted in its time.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// slowest is how many of the longest tests the summary lists.
const slowest = 10

type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail events name the package here
	Test       string
	Output     string
	Elapsed    float64
	Time       time.Time
}

func main() {
	times := flag.String("times", "", "also write every test's time to this file (tab-separated, longest first; a test that groups cases run one after another as its cases), for planning the suite's budget")
	timeline := flag.String("timeline", "", "also write when each of those tests started and ended, in seconds from the run's first event, to this file (tab-separated, by start): what ran beside what")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: testsummary [flags] [file ...]\nreads go test -json events from stdin, or from the files (named pipes of go test runs side by side) at once\nflags:")
		flag.PrintDefaults()
	}
	flag.Parse()
	var in io.Reader = os.Stdin
	inErr := func() error { return nil }
	if flag.NArg() > 0 {
		in, inErr = mergeLines(flag.Args())
	}
	code, timed := summarize(in, os.Stdout, os.Getenv("CI") != "")
	if err := inErr(); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		code = 1
	}
	for _, out := range []struct {
		path  string
		write func(string, []event) error
	}{{*times, writeTimes}, {*timeline, writeTimeline}} {
		if out.path == "" {
			continue
		}
		if err := out.write(out.path, timed); err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// writeTimeline writes one line per test that go test stamped: start
// and end in seconds from the earliest start, package, test, by start.
// A test's end is its pass or fail event's time; its start that less its
// elapsed time (a parallel test's includes its wait for a slot after
// t.Parallel, the part of the run it held nothing).
func writeTimeline(path string, timed []event) error {
	var stamped []event
	var origin time.Time
	for _, e := range timed {
		if e.Time.IsZero() {
			continue
		}
		stamped = append(stamped, e)
		if start := startOf(e); origin.IsZero() || start.Before(origin) {
			origin = start
		}
	}
	sort.SliceStable(stamped, func(i, j int) bool { return startOf(stamped[i]).Before(startOf(stamped[j])) })
	var b strings.Builder
	for _, e := range stamped {
		fmt.Fprintf(&b, "%.1f\t%.1f\t%s\t%s\n", startOf(e).Sub(origin).Seconds(), e.Time.Sub(origin).Seconds(), e.Package, e.Test)
	}
	return writeFile(path, b.String())
}

// startOf is when test e started: its end less its elapsed time.
func startOf(e event) time.Time {
	return e.Time.Add(-time.Duration(e.Elapsed * float64(time.Second)))
}

// writeFile writes s to path, making its directory.
func writeFile(path, s string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

// writeTimes writes one line per test: seconds, package, test.
func writeTimes(path string, timed []event) error {
	var b strings.Builder
	for _, e := range timed {
		fmt.Fprintf(&b, "%.1f\t%s\t%s\n", e.Elapsed, e.Package, e.Test)
	}
	return writeFile(path, b.String())
}

// slotWaitLine is what an e2e test logs when it waited for one of the
// run's work slots (e2e's parallel): time before the test started.
var slotWaitLine = regexp.MustCompile(`waited (\S+) for a work slot`)

// summarize reads go test -json from r, writes the summary to w and
// returns the exit code and every test that ended (see timings),
// longest first.
func summarize(r io.Reader, w io.Writer, ci bool) (int, []event) {
	out := map[string]*strings.Builder{}
	buildOut := map[string]*strings.Builder{} // compiler and vet output, by package, printed if it fails to build
	var failed []string
	passed, skipped, buildFailed := 0, 0, false
	var ended []event           // every test and subtest that ended, with its time
	paused := map[string]bool{} // tests that called t.Parallel
	var waits lockWaits
	slotWaits := map[string]time.Duration{} // by test: waits for an e2e work slot
	var first, last time.Time               // the run's span: go test stamps every event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintln(w, sc.Text()) // build errors, the fuzz step's lines and other non-JSON lines
			// A package that did not build, or a step beside the tests
			// that failed (scripts/fuzz.sh ends with a line "FAIL fuzz: ...").
			if strings.Contains(sc.Text(), "build failed") || strings.HasPrefix(sc.Text(), "#") || strings.HasPrefix(sc.Text(), "FAIL") {
				buildFailed = true
			}
			continue
		}
		if !e.Time.IsZero() {
			if first.IsZero() || e.Time.Before(first) {
				first = e.Time
			}
			if e.Time.After(last) {
				last = e.Time
			}
		}
		key := e.Package + "." + e.Test
		if (e.Action == "pass" || e.Action == "fail") && e.Test != "" {
			// A test's time starts when it has a work slot, as go test's
			// own starts when a parallel test has a -parallel slot.
			e.Elapsed = max(0, e.Elapsed-slotWaits[key].Seconds())
			ended = append(ended, e)
		}
		switch e.Action {
		case "build-output":
			if buildOut[e.ImportPath] == nil {
				buildOut[e.ImportPath] = &strings.Builder{}
			}
			buildOut[e.ImportPath].WriteString(e.Output)
		case "build-fail":
			buildFailed = true
			if b := buildOut[e.ImportPath]; b != nil {
				fmt.Fprint(w, b.String())
			}
			delete(buildOut, e.ImportPath)
		case "pause":
			paused[key] = true
		case "output":
			if e.Test != "" {
				waits.add(e)
				if m := slotWaitLine.FindStringSubmatch(e.Output); m != nil {
					if d, err := time.ParseDuration(m[1]); err == nil {
						slotWaits[key] += d
					}
				}
				if out[key] == nil {
					out[key] = &strings.Builder{}
				}
				out[key].WriteString(e.Output)
			} else if strings.HasPrefix(e.Output, "ok ") || strings.HasPrefix(e.Output, "FAIL") || strings.HasPrefix(e.Output, "---") {
				fmt.Fprint(w, e.Output)
			}
		case "pass":
			if e.Test != "" {
				passed++
				delete(out, key)
			}
		case "skip":
			if e.Test != "" {
				skipped++
				fmt.Fprintf(w, "SKIP %s %s\n", e.Package, e.Test)
				delete(out, key)
			}
		case "fail":
			if e.Test != "" {
				failed = append(failed, key)
			} else {
				buildFailed = true // a package failed outside any test: build error, TestMain, timeout
			}
		}
	}
	sort.Strings(failed)
	for _, k := range failed {
		fmt.Fprintf(w, "\n=== FAILED %s\n", k)
		if b := out[k]; b != nil {
			fmt.Fprint(w, b.String())
		}
	}
	timed := timings(ended, paused)
	top := timed[:min(len(timed), slowest)]
	if len(top) > 0 {
		fmt.Fprintln(w, "\nslowest tests:")
		for _, e := range top {
			fmt.Fprintf(w, "%8.1fs %s %s\n", e.Elapsed, e.Package, e.Test)
		}
	}
	waits.print(w, paused)
	if !first.IsZero() {
		fmt.Fprintf(w, "\nwall time %s\n", last.Sub(first).Round(time.Second))
	}
	fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped\n", passed, len(failed), skipped)
	if len(failed) > 0 || buildFailed {
		return 1, timed
	}
	if skipped > 0 && ci {
		fmt.Fprintln(w, "CI is set and tests were skipped: every test must run in CI")
		return 1, timed
	}
	return 0, timed
}

// A top-level test whose subtests (two or more, run one after another)
// take at least groupShare of its time, and that takes at least
// groupMin, is a group of cases (TestXRDP's twenty xrdp tests): its cases
// are timed in its place, so the slowest list names the slow case. A
// test with parallel subtests, or with time of its own outside them, is
// timed whole; and a quicker one is too, as go test times to 0.01 s and
// so short a test does not move the suite's budget.
const (
	groupShare = 0.9
	groupMin   = 1.0 // seconds
)

// timings returns the entries the summary times from every test that
// ended, longest first: each top-level test, or a group's cases in its
// place. Their times add up to the top-level tests' (within a tenth for
// a group), so the times file plans the budget with no test counted
// twice. paused holds the tests that called t.Parallel.
func timings(ended []event, paused map[string]bool) []event {
	cases := map[string][]event{} // direct subtests, by their parent's key
	for _, e := range ended {
		if parent, _, ok := strings.Cut(e.Test, "/"); ok && !strings.Contains(e.Test[len(parent)+1:], "/") {
			k := e.Package + "." + parent
			cases[k] = append(cases[k], e)
		}
	}
	var timed []event
	for _, e := range ended {
		if strings.Contains(e.Test, "/") {
			continue
		}
		if cs := cases[e.Package+"."+e.Test]; isGroup(e, cs, paused) {
			timed = append(timed, cs...)
		} else {
			timed = append(timed, e)
		}
	}
	sort.SliceStable(timed, func(i, j int) bool { return timed[i].Elapsed > timed[j].Elapsed })
	return timed
}

// isGroup says whether test t, with its direct subtests cs, is a group of
// cases run one after another (see groupShare).
func isGroup(t event, cs []event, paused map[string]bool) bool {
	if len(cs) < 2 || t.Elapsed < groupMin {
		return false
	}
	sum := 0.0
	for _, c := range cs {
		if paused[c.Package+"."+c.Test] {
			return false
		}
		sum += c.Elapsed
	}
	return sum >= groupShare*t.Elapsed
}
