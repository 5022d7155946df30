package e2e

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/bench/faults"
)

// TestFaultsStream runs the stream scenario of `deskway bench faults` at
// the test's scale: clients replaying the recorded boot while their
// server is killed. Whatever the timings, no acknowledged write may be
// lost and no client may read a disk other than its own; on an HA pair
// every client goes on without an I/O error, and on a single server
// every client goes on or is refused with the reason.
func TestFaultsStream(t *testing.T) {
	parallel(t) // asserts no timing; its servers are on ports the kernel chose
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	outs, err := faults.Stream().Run(ctx, faults.Env{Log: log, Bin: bin, Work: t.TempDir(), Small: true}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 3 {
		t.Fatalf("%d cases ran, want 3", len(outs))
	}
	for _, o := range outs {
		m := o.Metrics
		t.Logf("%s: %v", o.Case, m)
		if m["writes_lost"] != 0 || m["wrong_disks"] != 0 || m["io_errors"] != 0 {
			t.Errorf("%s: %v acknowledged writes lost, %v wrong disks, %v I/O errors: %s", o.Case, m["writes_lost"], m["wrong_disks"], m["io_errors"], o.Notes)
		}
		if m["writes_verified"] == 0 && m["refused"] != m["clients"] {
			t.Errorf("%s: no acknowledged write was read back; the case proved nothing", o.Case)
		}
		if !o.Held {
			t.Errorf("%s: the documented behaviour did not hold: %s", o.Case, o.Notes)
		}
	}
	ha := outs[0].Metrics
	if ha["clients_finished"] != ha["clients"] || ha["refused"] != 0 || ha["reconnected"] == 0 {
		t.Errorf("HA pair: %v of %v clients finished, %v refused, %v reconnected; every client must go on through the other server",
			ha["clients_finished"], ha["clients"], ha["refused"], ha["reconnected"])
	}
	// Write caches in RAM die with the server: every client whose boot
	// was under way is refused, none is handed the golden image.
	if ram := outs[1].Metrics; ram["refused"] == 0 {
		t.Errorf("single server, RAM caches: no client was refused after the restart: %s", outs[1].Notes)
	}
	if store := outs[2].Metrics; store["clients_finished"] != store["clients"] {
		t.Errorf("single server, caches on its store: %v of %v clients went on: %s", store["clients_finished"], store["clients"], outs[2].Notes)
	}
}
