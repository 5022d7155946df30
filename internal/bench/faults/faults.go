// Package faults is `deskway bench faults`: each scenario injects a fault
// (a killed process, a stopped database, a full disk, a cut link, a
// stepped clock) into deskway running under load with real clients, and
// counts who noticed, how long service took to come back, and what was
// lost or answered wrongly.
package faults

import (
	"context"
	"log/slog"
)

// Outcome is what one run of one fault case measured.
type Outcome struct {
	// Scenario names the scenario ("gateway", "broker", "stream", ...).
	Scenario string
	// Case names the fault within it in plain words ("kill -9 one node").
	Case string
	// Run counts from 1.
	Run int
	// Load says in plain words what ran while the fault struck.
	Load string
	// Users is how many users or clients were under load.
	Users int
	// Affected is how many of them noticed: an error, a reconnection or a
	// stall over a second.
	Affected int
	// RecoverS is the time from the fault to full service again, in
	// seconds; negative when service did not stop.
	RecoverS float64
	// Metrics holds the scenario's own counts and times, named as in
	// docs/benchmarks/faults (writes_lost, launches_lost,
	// launches_doubled, wrong_disks, io_errors, sessions_lost, ...).
	Metrics map[string]float64
	// Held says whether the behaviour the docs promise for this fault held.
	Held bool
	// Notes says what was seen, in a sentence or two.
	Notes string
}

// Env is what every scenario is given.
type Env struct {
	// Log receives progress.
	Log *slog.Logger
	// Bin is the deskway binary the scenario runs as its roles.
	Bin string
	// Work is a directory the scenario may fill and that is removed after.
	Work string
	// Small asks for the test's scale (a few clients) in place of the
	// bench's load; the zero-loss properties are the same.
	Small bool
	// HoldXRDP, when set, is called before a scenario starts xrdp and
	// xrdp-sesman and waits for the machine's one sesman port to be free
	// of anyone else's; the scenario calls what it returns when its xrdp
	// has stopped. A test leaves it nil: it holds that lock itself.
	HoldXRDP func(ctx context.Context) (release func(), err error)
}

// Scenario is one kind of fault with the cases it runs.
type Scenario struct {
	// Name is what --scenario selects.
	Name string
	// Run runs each of the scenario's cases once and returns one Outcome
	// per case; run is the run's number, from 1.
	Run func(ctx context.Context, env Env, run int) ([]Outcome, error)
}
