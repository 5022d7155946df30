package e2e

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/faults"
)

// TestFaultsClockStep runs the clock scenario of `deskway bench faults`
// at the test's scale: a real gateway whose clock is 10 minutes ahead of
// or behind the broker's refuses every fresh token, and its log says the
// clocks are apart (a bare "token is expired" sends an administrator
// after the wrong cause); one 20 seconds off either way, within the
// documented allowance, opens every tunnel.
func TestFaultsClockStep(t *testing.T) {
	parallel(t) // moves only its own gateway's token clock (a flag), on ports the kernel chose
	outs := runFaults(t, faults.Clock(), 2*time.Minute, 4)
	for i, o := range outs {
		m := o.Metrics
		t.Logf("%s: %v: %s", o.Case, m, o.Notes)
		if m["wrong_verdicts"] != 0 || !o.Held {
			t.Errorf("%s: %v wrong verdicts; the documented behaviour did not hold: %s", o.Case, m["wrong_verdicts"], o.Notes)
		}
		if i < 2 && m["refusals_naming_clocks"] != float64(o.Users) {
			t.Errorf("%s: %v of %d refusals in the gateway's log name the clocks: %s", o.Case, m["refusals_naming_clocks"], o.Users, o.Notes)
		}
		if i >= 2 && m["tunnels_opened"] != float64(o.Users) {
			t.Errorf("%s: %v of %d tunnels opened within the allowance", o.Case, m["tunnels_opened"], o.Users)
		}
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)## When a clock is off\n(.*?)\n## `).FindSubmatch(doc)
	if m == nil {
		t.Fatal(`docs/operations.md has no "When a clock is off" section`)
	}
	for _, want := range []string{"35 s", "token_ttl", "NTP", "E_PROXY_COOKIE_AUTHENTICATION_ACCESS_DENIED", "database's clock"} {
		if !strings.Contains(string(m[1]), want) {
			t.Errorf("docs/operations.md, When a clock is off: says nothing of %q", want)
		}
	}
}
