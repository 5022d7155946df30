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
// byte; set right, it opens a fresh tunnel again. Then a real broker
// whose clock steps 10 minutes back: every token it signs after the step
// is refused by a gateway keeping time, naming the clocks, the tunnels
// opened before go on, the broker still hears its host, and set right
// its next token opens a tunnel.
func TestFaultsClockJump(t *testing.T) {
	parallel(t) // moves only its own processes' token clocks (a flag), on ports the kernel chose
	outs := runFaults(t, faults.ClockJump(), 3*time.Minute, 2)
	for _, o := range outs {
		m := o.Metrics
		t.Logf("%s: %v: %s", o.Case, m, o.Notes)
		users := float64(o.Users)
		if o.Metrics["host_ok_after_step"] == 1 {
			users /= 2 // half of the broker case's users launch after the step
		}
		if m["tunnels_refused"] != users || m["wrong_verdicts"] != 0 || m["refusals_naming_clocks"] != users {
			t.Errorf("%s: after the step %v of %v fresh tokens refused, %v accepted, %v refusals naming the clocks", o.Case, m["tunnels_refused"], users, m["wrong_verdicts"], m["refusals_naming_clocks"])
		}
		if m["open_tunnels_kept"] != users || m["sessions_lost"] != 0 || m["bytes_lost"] != 0 || m["bytes_wrong"] != 0 {
			t.Errorf("%s: open tunnels: %v of %v kept, %v ended, %v bytes lost, %v wrong", o.Case, m["open_tunnels_kept"], users, m["sessions_lost"], m["bytes_lost"], m["bytes_wrong"])
		}
		if o.RecoverS < 0 || !o.Held {
			t.Errorf("%s: the documented behaviour did not hold: %s", o.Case, o.Notes)
		}
	}
	if outs[1].Metrics["host_ok_after_step"] != 1 {
		t.Errorf("%s: the broker lost its host after its clock stepped back: %s", outs[1].Case, outs[1].Notes)
	}
}
