package faults

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// TestDatabaseLinkCutLongerThanAClientWaits cuts the link between two
// real brokers and their PostgreSQL mid-storm for 15 s: longer than the
// 10 s the storm's client waits for an answer, and longer than a
// placement's bound on the database. The brokers must answer from their
// local host caches before the client gives up, and the placements sent
// to the database before the cut, which reach it when the link returns,
// must not take the place of what the users were told: no launch lost,
// none doubled, none refused.
func TestDatabaseLinkCutLongerThanAClientWaits(t *testing.T) {
	testkit.RequirePostgres(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "deskway")
	if out, err := exec.Command("go", "build", "-o", bin, "../../../cmd/deskway").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	env := Env{Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), Bin: bin, Work: dir, Small: true}
	o, err := linkDatabase(ctx, env, linkScaleFor(true), 1)
	if err != nil {
		t.Fatal(err)
	}
	m := o.Metrics
	t.Logf("%v: %s", m, o.Notes)
	if m["fault_s"] < 15 {
		t.Fatalf("the link was cut for %v s, want at least 15", m["fault_s"])
	}
	if m["launches"] == 0 || m["launches_lost"] != 0 || m["launches_doubled"] != 0 || m["launches_refused"] != 0 {
		t.Errorf("%v of %v launches lost, %v doubled, %v refused: %s",
			m["launches_lost"], m["launches"], m["launches_doubled"], m["launches_refused"], o.Notes)
	}
	if m["launches_retried"] != 0 || m["max_answer_s"] >= 10 {
		t.Errorf("%v launches went unanswered for the client's 10 s and were sent again; longest answer %.1f s", m["launches_retried"], m["max_answer_s"])
	}
}
