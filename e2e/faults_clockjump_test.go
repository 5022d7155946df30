package e2e

import (
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/faults"
)

// TestFaultsClockJump runs the clock-jump scenario of `deskway bench
// faults` at the test's scale: a real gateway whose clock jumps 10
// minutes ahead mid-run refuses every fresh token, its log naming the
// clocks and NTP, while the tunnels already open go on carrying every
// byte; set right, it opens a fresh tunnel again.
func TestFaultsClockJump(t *testing.T) {
	outs := runFaults(t, faults.ClockJump(), 2*time.Minute, 1)
	o := outs[0]
	m := o.Metrics
	t.Logf("%s: %v: %s", o.Case, m, o.Notes)
	if m["tunnels_refused"] != float64(o.Users) || m["wrong_verdicts"] != 0 || m["refusals_naming_clocks"] != float64(o.Users) {
		t.Errorf("after the jump: %v of %d fresh tokens refused, %v accepted, %v refusals naming the clocks", m["tunnels_refused"], o.Users, m["wrong_verdicts"], m["refusals_naming_clocks"])
	}
	if m["open_tunnels_kept"] != float64(o.Users) || m["sessions_lost"] != 0 || m["bytes_lost"] != 0 || m["bytes_wrong"] != 0 {
		t.Errorf("open tunnels: %v of %d kept, %v ended, %v bytes lost, %v wrong", m["open_tunnels_kept"], o.Users, m["sessions_lost"], m["bytes_lost"], m["bytes_wrong"])
	}
	if o.RecoverS < 0 || !o.Held {
		t.Errorf("the documented behaviour did not hold: %s", o.Notes)
	}
}
