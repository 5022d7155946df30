package report

import (
	"encoding/json"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSummaryKeepsNumbersAndNames: result.json's "summary" holds both
// headline numbers and headline names, and reads back into the same two.
func TestSummaryKeepsNumbersAndNames(t *testing.T) {
	r := Result{Bench: "broker", Summary: map[string]float64{"e2e_median_ms": 1.5},
		SummaryText: map[string]string{"e2e_bottleneck": "logon limit"}, Notes: []string{"how"}}
	b, err := json.Marshal(&r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"summary":{"e2e_bottleneck":"logon limit","e2e_median_ms":1.5}`) {
		t.Fatalf("result.json = %s", b)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Bench != "broker" || back.Summary["e2e_median_ms"] != 1.5 || back.SummaryText["e2e_bottleneck"] != "logon limit" || len(back.Notes) != 1 {
		t.Fatalf("read back %+v", back)
	}
	if err := json.Unmarshal([]byte(`{"summary":{"x":[1]}}`), &back); err == nil {
		t.Fatal("a summary value that is neither number nor name was read")
	}
}

func TestRoundAndMillis(t *testing.T) {
	for _, c := range []struct {
		v    float64
		d    int
		want float64
	}{{1.005, 1, 1.0}, {2.25, 1, 2.3}, {-2.25, 1, -2.3}, {1234.5678, 2, 1234.57}, {math.NaN(), 2, 0}, {7, 0, 7}} {
		if got := Round(c.v, c.d); got != c.want {
			t.Errorf("Round(%v, %d) = %v, want %v", c.v, c.d, got, c.want)
		}
	}
	if got := Millis(1500 * time.Microsecond); got != 1.5 {
		t.Errorf("Millis(1.5ms) = %v", got)
	}
}

// TestLoadAverageIsTheThreeAverages: the 1, 5 and 15 minute averages as
// the kernel gives them, nothing of the rest of /proc/loadavg.
func TestLoadAverageIsTheThreeAverages(t *testing.T) {
	if _, err := os.Stat("/proc/loadavg"); err != nil {
		t.Skipf("no /proc/loadavg: %v", err)
	}
	// The kernel moves the averages every 5 s: compare the form, not a
	// second reading.
	got := LoadAverage()
	f := strings.Fields(got)
	if len(f) != 3 {
		t.Fatalf("LoadAverage() = %q, want three averages", got)
	}
	for _, v := range f {
		if _, err := strconv.ParseFloat(v, 64); err != nil {
			t.Fatalf("LoadAverage() = %q: %v", got, err)
		}
	}
}
