package loopback

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A port handed out is not handed out again, to this process or another,
// for at least one reservation period, and is free again after two.
func TestReservationHoldsAPortForAPeriod(t *testing.T) {
	dir := t.TempDir()
	start := time.Unix(1_800_000_000, 0).Truncate(reserveFor)
	late := start.Add(reserveFor - time.Second)
	if !newReservations(dir, late).claim(25000) {
		t.Fatal("the first claim of a port was refused")
	}
	if newReservations(dir, late).claim(25000) {
		t.Fatal("a port was handed out twice in one period")
	}
	// Just after the period turns, the claim made a second earlier holds.
	if newReservations(dir, late.Add(2*time.Second)).claim(25000) {
		t.Fatal("a port claimed a second before the period turned was handed out again")
	}
	if !newReservations(dir, late).claim(25001) {
		t.Fatal("another port was refused")
	}
	later := start.Add(2 * reserveFor)
	if !newReservations(dir, later).claim(25000) {
		t.Fatal("a port claimed two periods ago is still refused")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Fatalf("reservation dirs %v, want the current period and the one before", entries)
	}
}

// Where the reservations cannot be written, ports are still handed out.
func TestReservationWithoutADirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := newReservations(filepath.Join(file, "ports"), time.Now())
	if !r.claim(25000) || !r.claim(25000) {
		t.Fatal("without a reservation directory a claim was refused")
	}
}

func TestFreePortsAreDifferentAndBindable(t *testing.T) {
	ports, err := FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] || p < 20000 || p >= 32000 {
			t.Fatalf("ports %v", ports)
		}
		seen[p] = true
	}
}
