// Command testsummary reads `go test -json` on stdin, prints each package
// result and the output of every failed test, and ends with one line:
// "N passed, N failed, N skipped". It exits 1 if anything failed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func main() {
	out := map[string]*strings.Builder{}
	var failed []string
	passed, skipped, buildFailed := 0, 0, false
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Println(sc.Text()) // build errors and other non-JSON lines
			if strings.Contains(sc.Text(), "build failed") || strings.HasPrefix(sc.Text(), "#") {
				buildFailed = true
			}
			continue
		}
		key := e.Package + "." + e.Test
		switch e.Action {
		case "output":
			if e.Test != "" {
				if out[key] == nil {
					out[key] = &strings.Builder{}
				}
				out[key].WriteString(e.Output)
			} else if strings.HasPrefix(e.Output, "ok ") || strings.HasPrefix(e.Output, "FAIL") || strings.HasPrefix(e.Output, "---") {
				fmt.Print(e.Output)
			}
		case "pass":
			if e.Test != "" {
				passed++
				delete(out, key)
			}
		case "skip":
			if e.Test != "" {
				skipped++
				fmt.Printf("SKIP %s %s\n", e.Package, e.Test)
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
		fmt.Printf("\n=== FAILED %s\n", k)
		if b := out[k]; b != nil {
			fmt.Print(b.String())
		}
	}
	fmt.Printf("\n%d passed, %d failed, %d skipped\n", passed, len(failed), skipped)
	if len(failed) > 0 || buildFailed {
		os.Exit(1)
	}
}
