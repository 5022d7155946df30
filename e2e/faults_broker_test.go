package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/testkit"
)

// TestFaultsBroker runs `deskway bench faults --scenario broker` at the
// tests' scale (--small, one run): two real broker processes on one real
// PostgreSQL under a launch storm through the HTTP launch API, with
// simulated session hosts; one broker is killed with SIGKILL mid-storm,
// then (on a fresh farm) PostgreSQL is stopped for 10 s and started
// again. Read from the database afterwards: no launch is lost (every
// launch answered, every answer a live, broker-placed session on the
// host it named) and none is doubled (no user with two sessions, no host
// over its limit), not even for a user launching again in the outage at
// the broker that did not place their session (the brokers ask each
// other, broker.peers). The timings are the bench's business, not this
// test's.
func TestFaultsBroker(t *testing.T) {
	parallel(t) // asserts no timing; its brokers and PostgreSQL are on ports the kernel chose
	testkit.RequirePostgres(t)
	out := t.TempDir()
	res := runBench(t, out, "faults", "--scenario", "broker", "--runs", "1", "--small")
	if res.Bench != "faults" || res.Summary["runs_per_scenario"] != 1 {
		t.Fatalf("header: bench %q, summary %v", res.Bench, res.Summary)
	}
	if len(res.Points) != 2 {
		t.Fatalf("%d points, want the broker scenario's 2 cases (kill a broker, stop the database)", len(res.Points))
	}
	for _, p := range res.Points {
		m, c := p.Metrics, p.Params["case"]
		t.Logf("%s: %g users, %g answered during the fault, %g held by the killed broker, %g retried: %v",
			c, m["users"], m["answered_during_fault"], m["launches_held_by_killed"], m["launches_retried"], p.Params["notes"])
		if m["answered_during_fault"] == 0 {
			t.Errorf("%s: no launch was answered during the fault: the storm did not overlap it, so the test proved nothing", c)
		}
		if m["launches_lost"] != 0 || m["launches_unanswered"] != 0 {
			t.Errorf("%s: %g launches lost (%g never answered): %v", c, m["launches_lost"], m["launches_unanswered"], p.Params["notes"])
		}
		if d := m["launches_doubled"]; d != 0 {
			t.Errorf("%s: %g launches doubled: %v", c, d, p.Params["notes"])
		}
		if m["launches_refused"] != 0 || m["sessions_stray"] != 0 {
			t.Errorf("%s: %g launches refused, %g sessions in the database that no host has: %v", c, m["launches_refused"], m["sessions_stray"], p.Params["notes"])
		}
		if p.Params["held"] != true {
			t.Errorf("%s: the documented behaviour did not hold: %v", c, p.Params["notes"])
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "result.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| scenario | load | fault | users | users affected (median / worst) | time to recover (median / worst) |",
		"kill -9 one of two brokers mid-storm", "Local Host Cache"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("result.md lacks %q", want)
		}
	}
	// A name that is no scenario is refused in words.
	b, err := exec.Command(build(t), "bench", "faults", "--scenario", "broker,nope", "--out", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(b), `there is no scenario "nope"`) {
		t.Errorf("--scenario broker,nope: %v, %s", err, b)
	}
}
