package web

import "testing"

func TestRate(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 0.04: "0.0", 0.25: "0.2", 6.5: "6.5", 9.96: "10.0", 10: "10", 999.4: "999",
		1000: "1.0k", 1550: "1.6k", 12345: "12k"} {
		if got := rate(in); got != want {
			t.Errorf("rate(%g) = %q, want %q", in, got, want)
		}
	}
}
