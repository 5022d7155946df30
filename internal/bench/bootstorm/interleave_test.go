package bootstorm

import (
	"context"
	"slices"
	"testing"

	"github.com/deskway/deskway/internal/bench/report"
)

// TestRunsInterleaveSystems: with three runs of deskway and the floor the
// storms alternate, so a stretch of load from elsewhere on a shared
// machine falls on both, and each system still gets its own three runs.
func TestRunsInterleaveSystems(t *testing.T) {
	var order []string
	systems := []system{{name: "deskway"}, {name: floorName}}
	points, err := interleave(context.Background(), systems, 3, func(sys system) (report.Point, error) {
		order = append(order, sys.name)
		return report.Point{System: sys.name, Params: map[string]any{}, Metrics: map[string]float64{"run": float64(len(order))}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"deskway", floorName, "deskway", floorName, "deskway", floorName}
	if !slices.Equal(order, want) {
		t.Fatalf("runs went %v, want %v", order, want)
	}
	for i, sys := range systems {
		if len(points[i]) != 3 {
			t.Fatalf("%s has %d runs, want 3", sys.name, len(points[i]))
		}
		for _, p := range points[i] {
			if p.System != sys.name {
				t.Errorf("%s's runs hold one of %s", sys.name, p.System)
			}
		}
	}
}
