package report

import (
	"encoding/json"
	"strings"
	"testing"
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
