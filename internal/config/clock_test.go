package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestClockFileStepsTheClockMidRun: the offset in ClockFile is read each
// time the clock is, so rewriting the file moves the clock of a running
// role; without the file, ClockOffset holds.
func TestClockFileStepsTheClockMidRun(t *testing.T) {
	file := filepath.Join(t.TempDir(), "offset")
	c := &Config{ClockOffset: time.Minute, ClockFile: file}
	near := func(want time.Duration) {
		t.Helper()
		if got := time.Until(c.Now()); got < want-5*time.Second || got > want+5*time.Second {
			t.Errorf("the clock is %s off, want %s", got.Round(time.Second), want)
		}
	}
	near(time.Minute)
	for _, step := range []struct {
		text string
		want time.Duration
	}{{"10m\n", 10 * time.Minute}, {"-10m", -10 * time.Minute}, {"not a duration", time.Minute}} {
		if err := os.WriteFile(file, []byte(step.text), 0o600); err != nil {
			t.Fatal(err)
		}
		near(step.want)
	}
}
