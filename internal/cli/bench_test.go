package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/deskway/deskway/internal/bench/report"
)

// TestRunBenchHandsOverItsFlagsAndPrintsTheSummary: a bench subcommand's
// bench gets the --out directory, the command line and a log on stderr,
// and its headline figures and the results' directory are printed after;
// a bench that fails prints nothing and its error is the command's.
func TestRunBenchHandsOverItsFlagsAndPrintsTheSummary(t *testing.T) {
	for _, fail := range []bool{false, true} {
		var out string
		var got benchRun
		c := &cobra.Command{Use: "demo", Args: cobra.NoArgs, SilenceUsage: true, SilenceErrors: true,
			RunE: runBench(&out, func(_ context.Context, r benchRun) (*report.Result, error) {
				got = r
				r.log.Info("bench ran")
				if fail {
					return nil, errors.New("bench: no xrdp")
				}
				return &report.Result{Summary: map[string]float64{"launch_p50_ms": 12.5}, SummaryText: map[string]string{"limited_by": "cpu"}}, nil
			})}
		c.Flags().StringVar(&out, "out", "", "directory for results")
		var stdout, stderr bytes.Buffer
		c.SetOut(&stdout)
		c.SetErr(&stderr)
		c.SetArgs([]string{"--out", "/tmp/demo-results"})
		err := c.Execute()
		if got.out != "/tmp/demo-results" || !strings.HasPrefix(got.command, "deskway ") || !strings.Contains(stderr.String(), "bench ran") {
			t.Fatalf("the bench got out %q, command %q; stderr %q", got.out, got.command, stderr.String())
		}
		if fail {
			if err == nil || err.Error() != "bench: no xrdp" || stdout.Len() != 0 {
				t.Fatalf("a failed bench: error %v, printed %q", err, stdout.String())
			}
			continue
		}
		if want := "launch_p50_ms\t12.5\nlimited_by\tcpu\nresults in /tmp/demo-results\n"; err != nil || stdout.String() != want {
			t.Fatalf("printed %q (error %v), want %q", stdout.String(), err, want)
		}
	}
}

// TestCountsReadsTheBenchesLists: the benches' comma-separated counts
// (tunnels, clients, launches in flight) skip blanks and name the flag
// and the entry that is not a positive whole number.
func TestCountsReadsTheBenchesLists(t *testing.T) {
	got, err := counts("--steps", " 100, 200,,8000 ")
	if err != nil || len(got) != 3 || got[0] != 100 || got[1] != 200 || got[2] != 8000 {
		t.Fatalf("counts = %v, %v", got, err)
	}
	for _, bad := range []string{"100,0", "100,-5", "1k"} {
		if _, err := counts("--steps", bad); err == nil || !strings.Contains(err.Error(), "bench: --steps: ") || !strings.Contains(err.Error(), "is not a positive count") {
			t.Fatalf("counts(%q): %v", bad, err)
		}
	}
}
