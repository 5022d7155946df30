package e2e

import (
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/faults"
)

// TestFaultsLinkStream runs the link-stream scenario of `deskway bench
// faults` at the test's scale: machines reading and writing their disks
// through a real stream server while the link between them is cut (no
// reset, no FIN), once for less than the kernel's request timeout that
// deskway-nbdroot sets, once for more. Whatever the timings: every
// machine answers again, with no I/O error, every acknowledged write
// reads back and no read returns other bytes than the last write; the
// longer cut makes each machine replace its connection.
func TestFaultsLinkStream(t *testing.T) {
	parallel(t) // asserts no timing; its server and proxy are on ports the kernel chose
	outs := runFaults(t, faults.LinkStream(), 4*time.Minute, 2)
	for _, o := range outs {
		m := o.Metrics
		t.Logf("%s: %v: %s", o.Case, m, o.Notes)
		if m["writes_lost"] != 0 || m["wrong_disks"] != 0 || m["io_errors"] != 0 || m["writes_acked"] == 0 || !o.Held {
			t.Errorf("%s: %v of %v acknowledged writes lost, %v machines read a different disk, %v I/O errors: %s",
				o.Case, m["writes_lost"], m["writes_acked"], m["wrong_disks"], m["io_errors"], o.Notes)
		}
	}
	if short, long := outs[0].Metrics, outs[1].Metrics; short["cut_s"] >= short["request_timeout_s"] || long["cut_s"] <= long["request_timeout_s"] || long["reconnects"] < float64(outs[1].Users) {
		t.Errorf("cuts of %v s and %v s against a request timeout of %v s; %v connections replaced after the longer one, want one a machine at least",
			short["cut_s"], long["cut_s"], long["request_timeout_s"], long["reconnects"])
	}
}
