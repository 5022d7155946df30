// Command testsummary reads `go test -json` on stdin, prints each package
// result and the output of every failed test, and ends with one line:
// "N passed, N failed, N skipped", after the ten slowest top-level tests
// and the run's wall time (the suite's time budget is spent there, so a
// run says where). It exits 1 if anything failed, and,
// when CI is set, if anything was skipped: in CI every real peer must run,
// and a skipped test would be a check that silently did not happen.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// slowest is how many of the longest tests the summary lists.
const slowest = 10

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
	Time    time.Time
}

func main() {
	times := flag.String("times", "", "also write every top-level test's time to this file (tab-separated, longest first), for planning the suite's budget")
	flag.Parse()
	code, timed := summarize(os.Stdin, os.Stdout, os.Getenv("CI") != "")
	if *times != "" {
		if err := writeTimes(*times, timed); err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// writeTimes writes one line per test: seconds, package, test.
func writeTimes(path string, timed []event) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var b strings.Builder
	for _, e := range timed {
		fmt.Fprintf(&b, "%.1f\t%s\t%s\n", e.Elapsed, e.Package, e.Test)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// summarize reads go test -json from r, writes the summary to w and
// returns the exit code and every top-level test that ended, longest
// first.
func summarize(r io.Reader, w io.Writer, ci bool) (int, []event) {
	out := map[string]*strings.Builder{}
	var failed []string
	passed, skipped, buildFailed := 0, 0, false
	var timed []event         // top-level tests that ended, with their time
	var first, last time.Time // the run's span: go test stamps every event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintln(w, sc.Text()) // build errors and other non-JSON lines
			if strings.Contains(sc.Text(), "build failed") || strings.HasPrefix(sc.Text(), "#") {
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
		if (e.Action == "pass" || e.Action == "fail") && e.Test != "" && !strings.Contains(e.Test, "/") {
			timed = append(timed, e)
		}
		switch e.Action {
		case "output":
			if e.Test != "" {
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
	sort.SliceStable(timed, func(i, j int) bool { return timed[i].Elapsed > timed[j].Elapsed })
	top := timed[:min(len(timed), slowest)]
	if len(top) > 0 {
		fmt.Fprintln(w, "\nslowest tests:")
		for _, e := range top {
			fmt.Fprintf(w, "%8.1fs %s %s\n", e.Elapsed, e.Package, e.Test)
		}
	}
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
