package report

import (
	"math"
	"time"
)

// Round rounds v to digits decimals, half away from zero, the precision a
// bench keeps in result.json; NaN (a mean of nothing) is 0.
func Round(v float64, digits int) float64 {
	if math.IsNaN(v) {
		return 0
	}
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// Millis is d in milliseconds, to the microsecond.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
