package e2e

import (
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/faults"
)

// TestFaultsLinkAgent runs the link-agent scenario of `deskway bench
// faults`: a real broker whose link to one session host's agent is cut
// for longer than broker.heartbeat_timeout while users launch. The
// broker marks the host unreachable within the timeout and a heartbeat,
// sends it no launch from then on (with the other hosts drained, a
// launch is refused rather than placed on it), takes it back once its reports
// return, and every session the hosts hold has its record on its host.
func TestFaultsLinkAgent(t *testing.T) {
	outs := runFaults(t, faults.LinkAgent(), 3*time.Minute, 1)
	o := outs[0]
	m := o.Metrics
	t.Logf("%s: %v: %s", o.Case, m, o.Notes)
	if s := m["stale_after_s"]; s <= 0 || s > m["heartbeat_timeout_s"]+3 {
		t.Errorf("the cut host was marked unreachable %v s after the cut (-1: never), want within the heartbeat timeout of %v s and 3 s", s, m["heartbeat_timeout_s"])
	}
	if m["launches_to_cut_host_after_stale"] != 0 || m["launches_to_cut_host_after_return"] == 0 || m["back_after_s"] < 0 {
		t.Errorf("launches to the cut host once stale: %v; after its link returned: %v (back after %v s)", m["launches_to_cut_host_after_stale"], m["launches_to_cut_host_after_return"], m["back_after_s"])
	}
	if m["launches_refused_with_only_cut_host"] != 4 || m["launches_to_cut_host_with_only_it"] != 0 {
		t.Errorf("with the other hosts drained while the cut host was unreachable: %v of 4 launches refused, %v placed on it", m["launches_refused_with_only_cut_host"], m["launches_to_cut_host_with_only_it"])
	}
	if m["sessions_lost"] != 0 || m["sessions_on_wrong_host"] != 0 || m["sessions_held"] == 0 || m["launches_failed"] != 0 {
		t.Errorf("%v of %v sessions without a record, %v on another host, %v launches failed", m["sessions_lost"], m["sessions_held"], m["sessions_on_wrong_host"], m["launches_failed"])
	}
	if !o.Held {
		t.Errorf("the documented behaviour did not hold: %s", o.Notes)
	}
}
