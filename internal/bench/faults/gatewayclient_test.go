package faults

import (
	"slices"
	"testing"
	"time"
)

// TestReconnectedIn: only a channel loaded after a reconnect attempt,
// in the part of the log written since the mark, counts.
func TestReconnectedIn(t *testing.T) {
	const before = "[10:44:53:429] [1:2] [INFO][com.freerdp.channels.drdynvc.client] - Loading Dynamic Virtual Channel rdpgfx\n"
	const attempt = "[10:45:34:341] [1:2] [INFO][com.freerdp.client.common] - Attempting reconnect (1 of 20)\n"
	const loaded = "[10:45:36:687] [1:2] [INFO][com.freerdp.channels.drdynvc.client] - Loading Dynamic Virtual Channel rdpgfx\n"
	for _, c := range []struct {
		log  string
		from int
		want bool
	}{
		{before + attempt + loaded, len(before), true},
		{before + attempt, len(before), false},                    // still connecting
		{before + attempt + loaded, len(before + attempt), false}, // its attempt was before the mark
		{before, 0, false},                 // a channel, but no reconnect
		{attempt + loaded, 1 << 20, false}, // a mark past the log
	} {
		if got := reconnectedIn(c.log, c.from); got != c.want {
			t.Errorf("reconnectedIn(%q, %d) = %v, want %v", c.log, c.from, got, c.want)
		}
	}
}

// TestOutcomeSplitsTheReconnect: of the clients that came back by
// reconnecting, the outcome gives the fault-to-connection time and the
// session host's part after it, and counts 10 s itself as within 10 s.
func TestOutcomeSplitsTheReconnect(t *testing.T) {
	r := &gwRig{}
	res := []clientResult{
		{affected: true, back: true, sameSession: true, reconnects: 1, backAfter: 4 * time.Second, connectedAfter: 2 * time.Second},
		{affected: true, back: true, sameSession: true, reconnects: 1, backAfter: 12 * time.Second, connectedAfter: 10 * time.Second},
		{affected: true, back: true, sameSession: true, reconnects: 1, backAfter: 9 * time.Second, connectedAfter: 3 * time.Second},
		{sameSession: true},
	}
	o := r.outcome(Outcome{}, "kill -9 one node", res, 2)
	want := map[string]float64{"connected_median_s": 3, "connected_worst_s": 10, "connected_within_10s_pct": 100,
		"host_part_median_s": 2, "host_part_worst_s": 6, "back_within_10s_pct": 66.67}
	for k, v := range want {
		if o.Metrics[k] != v {
			t.Errorf("%s = %v, want %v (%v)", k, o.Metrics[k], v, o.Metrics)
		}
	}
}

// TestOpenSharesAfterTheMark: only the "tunnel open" lines written after
// the mark count, each by its open_ms and served_ms.
func TestOpenSharesAfterTheMark(t *testing.T) {
	before := `{"time":"t","level":"INFO","msg":"tunnel open","open_ms":900,"served_ms":800}` + "\n"
	after := `{"time":"t","level":"INFO","msg":"tunnel closed","open_ms":5}` + "\n" +
		`{"time":"t","level":"INFO","msg":"tunnel open","target":"127.0.0.1:3389","open_ms":41.5,"served_ms":3.5}` + "\n" +
		`{"time":"t","level":"INFO","msg":"tunnel open","open_ms":12,"served_ms":2}` + "\n"
	got := openShares(before+after, len(before))
	if !slices.Equal(got.open, []float64{41.5, 12}) || !slices.Equal(got.served, []float64{3.5, 2}) {
		t.Errorf("openShares = %+v, want open [41.5 12], served [3.5 2]", got)
	}
	o := Outcome{Metrics: map[string]float64{}}
	addOpenShares(&o, got)
	m := o.Metrics
	if m["gateway_open_ms_median"] != 41.5 || m["gateway_open_ms_worst"] != 41.5 || m["gateway_tunnels_opened"] != 2 ||
		m["gateway_served_ms_median"] != 3.5 || m["gateway_served_ms_worst"] != 3.5 {
		t.Errorf("metrics %v", m)
	}
}
