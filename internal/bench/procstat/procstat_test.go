package procstat

import (
	"testing"
	"time"
)

func TestReadSelf(t *testing.T) {
	a, err := Read(0)
	if err != nil {
		t.Fatal(err)
	}
	// Burn some CPU so the counter moves.
	end := time.Now().Add(200 * time.Millisecond)
	x := 0
	for time.Now().Before(end) {
		x++
	}
	b, _ := Read(0)
	if b.RSS <= 0 || b.CPU <= a.CPU {
		t.Fatalf("rss %d, cpu %s -> %s", b.RSS, a.CPU, b.CPU)
	}
	if p := CPUPercent(a, b); p < 30 || p > 250 {
		t.Fatalf("busy loop measured at %.0f%% of a core", p)
	}
}
