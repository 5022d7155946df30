package ttff

import (
	"os"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// TestTraceCountsSleepsBeforeTheFirstFrame reads a legacy-transport
// connection's strace: the start, the two connections to the gateway,
// the 10 ms and 100 ms sleeps before the first frame (one of them on
// another thread, split into unfinished and resumed lines), and not the
// sleep after it.
func TestTraceCountsSleepsBeforeTheFirstFrame(t *testing.T) {
	f, err := os.Open("testdata/legacy.strace")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := parseTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(1795816507, 822469000); !tr.execve.Equal(want) {
		t.Fatalf("execve at %v, want %v", tr.execve, want)
	}
	frame := time.Unix(1795816508, 900000000)
	w := tr.sleeps(100*time.Millisecond, frame)
	if w.count != 3 || w.threads != 2 || w.mainThread < 200*time.Millisecond || w.mainThread > 201*time.Millisecond {
		t.Errorf("100 ms sleeps: %+v, want 3 on 2 threads, 200 ms on the busiest", w)
	}
	if w := tr.sleeps(10*time.Millisecond, frame); w.count != 1 {
		t.Errorf("10 ms sleeps: %+v, want 1", w)
	}
	if n := tr.connects(25696, frame); n != 2 {
		t.Errorf("connects to the gateway: %d, want 2", n)
	}
	if n := tr.connects(3389, frame); n != 0 {
		t.Errorf("connects to another port: %d, want 0", n)
	}
}

// TestTunnelOpenLineGivesTheGatewaysTimes reads the gateway's JSON log:
// the first "tunnel open" line's open_ms and its own working times.
func TestTunnelOpenLineGivesTheGatewaysTimes(t *testing.T) {
	log := `{"msg":"gateway listening"}
{"msg":"tunnel open","open_ms":41.5,"http_ms":0.25,"served_ms":1.5,"dial_ms":0.125}
{"msg":"tunnel open","open_ms":99}
`
	got, ok := parseTunnelOpen(log)
	want := gatewayTimes{open: 41500 * time.Microsecond, http: 250 * time.Microsecond, served: 1500 * time.Microsecond, dial: 125 * time.Microsecond}
	if !ok || got != want {
		t.Fatalf("parseTunnelOpen = %+v, %v; want %+v", got, ok, want)
	}
	if _, ok := parseTunnelOpen(`{"msg":"tunnel closed"}`); ok {
		t.Error("a log without a tunnel open line gave times")
	}
}

// TestSummaryTakesTheSleepsOut: a deskway way that lost two more 100 ms
// races than the plain hop is 0.2 s later in its first frame, and only
// its own 0.04 s with the sleeps taken out.
func TestSummaryTakesTheSleepsOut(t *testing.T) {
	mk := func(ff, slept time.Duration) sample {
		return sample{firstFrame: ff, waits: waits{count: int(slept / (100 * time.Millisecond)), threads: 1, mainThread: slept}}
	}
	runs := map[string][]sample{}
	for _, sys := range systems() {
		runs[sys.name] = []sample{mk(1500*time.Millisecond, 500*time.Millisecond)}
	}
	runs["deskway-websocket-ntlm"] = []sample{mk(1740*time.Millisecond, 700*time.Millisecond)}
	res := &report.Result{Summary: map[string]float64{}}
	summarize(res, runs)
	if got := res.Summary["ttff_added_s"]; got != 0.24 {
		t.Errorf("ttff_added_s = %v, want 0.24", got)
	}
	if got := res.Summary["ttff_added_less_waits_s"]; got != 0.04 {
		t.Errorf("ttff_added_less_waits_s = %v, want 0.04", got)
	}
}
