package e2e

import (
	"context"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/faults"
	"github.com/deskway/deskway/internal/testkit"
)

// TestFaultsDisk runs the disk scenario of `deskway bench faults` at the
// test's scale: the broker's state directory on a 4 MiB tmpfs filled
// from outside during a launch storm and administrators' drains, then
// emptied, and a stream server's cache store likewise while a client
// writes. Whatever the timings, no launch a client was told succeeded
// may be missing from the database, no admin action done may be missing
// from the audit trail, the database must pass its integrity check,
// every refusal must be a sentence, no write the stream server
// acknowledged may be missing, and service must come back without a
// restart.
func TestFaultsDisk(t *testing.T) {
	testkit.RequireRoot(t)
	testkit.Require(t, "mount", "umount")
	outs := runFaults(t, faults.DiskFull(), 3*time.Minute, 3)
	for _, o := range outs {
		t.Logf("%s: %v: %s", o.Case, o.Metrics, o.Notes)
		if !o.Held {
			t.Errorf("%s: the documented behaviour did not hold: %s", o.Case, o.Notes)
		}
	}
	b, a := outs[0].Metrics, outs[1].Metrics
	if b["launches_lost"] != 0 || b["sessions_without_host"] != 0 || b["corrupt_database"] != 0 || b["refusals_with_internal_errors"] != 0 {
		t.Errorf("broker: %v launches lost, %v sessions without their host, corrupt database %v, %v refusals showing internal errors",
			b["launches_lost"], b["sessions_without_host"], b["corrupt_database"], b["refusals_with_internal_errors"])
	}
	if b["launches_refused_during"] == 0 {
		t.Errorf("broker: no launch was refused while the disk was full; the fault did not strike: %s", outs[0].Notes)
	}
	if a["admin_actions_unaudited"] != 0 {
		t.Errorf("audit: %v admin actions, done or refused, are missing from the audit trail: %s", a["admin_actions_unaudited"], outs[1].Notes)
	}
	// The stream server never acknowledges a write its store did not
	// take, and stores writes again once there is room.
	if s := outs[2].Metrics; s["writes_lost"] != 0 || s["writes_refused_during"] == 0 || s["other_errors"] != 0 {
		t.Errorf("stream: %v acknowledged writes lost, %v refused with ENOSPC while the store was full, %v other errors: %s",
			s["writes_lost"], s["writes_refused_during"], s["other_errors"], outs[2].Notes)
	}
	// What each role does when its disk fills is documented.
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)## When a disk fills\n(.*?)\n## `).FindSubmatch(doc)
	if m == nil {
		t.Fatal(`docs/operations.md has no "When a disk fills" section`)
	}
	for _, want := range []string{"503", "no space left", "integrity", "audit", "without a restart", "stream"} {
		if !strings.Contains(string(m[1]), want) {
			t.Errorf("docs/operations.md, When a disk fills: says nothing of %q", want)
		}
	}
}

// runFaults runs one scenario of `deskway bench faults` once at the
// test's scale with the deskway binary, within timeout, and fails the
// test unless it gave the want cases.
func runFaults(t *testing.T, sc faults.Scenario, timeout time.Duration, want int) []faults.Outcome {
	t.Helper()
	// The binary first: the scenario's budget is for the scenario, and
	// linking deskway on a busy machine took all of a 2-minute one.
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	outs, err := sc.Run(ctx, faults.Env{Log: log, Bin: bin, Work: t.TempDir(), Small: true}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != want {
		t.Fatalf("%d cases ran, want %d", len(outs), want)
	}
	return outs
}
