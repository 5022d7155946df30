package e2e

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/faults"
	"github.com/deskway/deskway/internal/testkit"
)

// TestFaultsLinkCut runs the link scenario of `deskway bench faults` at
// the test's scale: the link between a real gateway and an echo host cut
// (packets dropped, nothing reset) while tunnels carry a checked byte
// pattern, and the link between two real brokers and their PostgreSQL
// cut mid-storm. Whatever the timings: a cut the buffers ride out loses
// no byte and no tunnel; under bulk load the gateway's write timeout
// ends every tunnel, the gateway's log naming it, and a new tunnel works
// once the link is back; no launch is lost or doubled, and none
// refused. At this scale the
// database's link is cut for 15 s, longer than the storm's client waits
// (10 s) and than the brokers' 5 s before they answer from their caches.
func TestFaultsLinkCut(t *testing.T) {
	testkit.RequirePostgres(t)
	outs := runFaults(t, faults.Link(), 4*time.Minute, 3)
	for _, o := range outs {
		t.Logf("%s: %v: %s", o.Case, o.Metrics, o.Notes)
		if !o.Held {
			t.Errorf("%s: the documented behaviour did not hold: %s", o.Case, o.Notes)
		}
	}
	if m := outs[0].Metrics; m["bytes_lost"] != 0 || m["bytes_wrong"] != 0 || m["sessions_lost"] != 0 || m["cut_s"] <= m["write_timeout_s"] {
		t.Errorf("interactive: %v bytes lost, %v wrong, %v tunnels ended, a cut of %v s against a write timeout of %v s",
			m["bytes_lost"], m["bytes_wrong"], m["sessions_lost"], m["cut_s"], m["write_timeout_s"])
	}
	if m := outs[1].Metrics; m["tunnels_ended"] != float64(outs[1].Users) || m["new_tunnel_ok"] != 1 || m["bytes_wrong"] != 0 {
		t.Errorf("bulk: %v of %d tunnels ended by the gateway, a new tunnel after the cut %v, %v bytes wrong: %s",
			m["tunnels_ended"], outs[1].Users, m["new_tunnel_ok"], m["bytes_wrong"], outs[1].Notes)
	}
	if m := outs[2].Metrics; m["launches_lost"] != 0 || m["launches_doubled"] != 0 || m["launches_refused"] != 0 || m["launches"] == 0 {
		t.Errorf("database link: %v of %v launches lost, %v doubled, %v refused: %s",
			m["launches_lost"], m["launches"], m["launches_doubled"], m["launches_refused"], outs[2].Notes)
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)## When a link is cut\n(.*?)\n## `).FindSubmatch(doc)
	if m == nil {
		t.Fatal(`docs/operations.md has no "When a link is cut" section`)
	}
	for _, want := range []string{"write_timeout", "host took no data", "10 s", "local host cache", "nothing is lost", "same session id"} {
		if !strings.Contains(string(m[1]), want) {
			t.Errorf("docs/operations.md, When a link is cut: says nothing of %q", want)
		}
	}
}
