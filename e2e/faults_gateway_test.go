package e2e

import (
	"log/slog"
	"os"
	"testing"

	"github.com/deskway/deskway/internal/bench/faults"
	"github.com/deskway/deskway/internal/testkit"
)

// TestFaultsGatewayNodeDies runs the gateway scenario of `deskway bench
// faults` at the test's scale: four xfreerdp clients (two websocket, two
// legacy RDG HTTP) through two gateway nodes behind round-robin HAProxy,
// each in its own xrdp desktop. One node is killed with SIGKILL: every
// client must come back by itself (the broker's .rdp file turns on
// xfreerdp's auto-reconnect) through the other node to its own xrdp
// session. Then the node carrying them is drained on HAProxy's stats
// socket, which no client may notice, and stopped: again every client
// comes back to its own session. Timings are the bench's to report, not
// the test's to hold.
func TestFaultsGatewayNodeDies(t *testing.T) {
	testkit.Require(t, "xfreerdp", "Xvfb", "xrdp", "xrdp-sesman", "xterm", "haproxy")
	testkit.RequireRoot(t)
	env := faults.Env{
		Log:   slog.New(slog.NewTextHandler(os.Stderr, nil)),
		Bin:   build(t),
		Work:  t.TempDir(),
		Small: true,
	}
	sc := faults.Gateway()
	if sc.Name != "gateway" {
		t.Fatalf("the scenario is named %q, want gateway", sc.Name)
	}
	outs, err := sc.Run(t.Context(), env, 1)
	for _, o := range outs {
		t.Logf("%s: users %d, affected %d, recover %.2f s, %v, held %v: %s", o.Case, o.Users, o.Affected, o.RecoverS, o.Metrics, o.Held, o.Notes)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 3 {
		t.Fatalf("the scenario ran %d cases, want 3 (kill, drain, stop)", len(outs))
	}
	kill, drain, stop := outs[0], outs[1], outs[2]
	if kill.Metrics["clients_on_node"] == 0 || kill.Affected == 0 {
		t.Errorf("killing a node touched no client (%d on it, %d affected): the test proves nothing", int(kill.Metrics["clients_on_node"]), kill.Affected)
	}
	for _, o := range []faults.Outcome{kill, stop} {
		if lost := o.Metrics["sessions_lost"]; lost != 0 {
			t.Errorf("%s: %v of %d clients did not come back by themselves to their own xrdp session", o.Case, lost, o.Users)
		}
		if int(o.Metrics["back_same_session"]) != o.Affected {
			t.Errorf("%s: %d clients noticed, %v came back to their own session", o.Case, o.Affected, o.Metrics["back_same_session"])
		}
	}
	if drain.Metrics["clients_on_node"] == 0 {
		t.Error("the drained node carried no client: the test proves nothing")
	}
	if drain.Affected != 0 || drain.Metrics["sessions_lost"] != 0 {
		t.Errorf("draining a node was noticed: %d clients stalled or reconnected, %v lost", drain.Affected, drain.Metrics["sessions_lost"])
	}
}
