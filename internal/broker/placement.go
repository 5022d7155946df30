package broker

import (
	"math"
	"math/rand/v2"

	"github.com/deskway/deskway/internal/broker/store"
)

// loadBucket is a host's load index in 5 % steps, divided by its weight:
// hosts in one bucket count as equal, so a burst spreads over them instead
// of all landing on the single lowest one. The database's placement
// statement computes the same.
func loadBucket(h store.Host) float64 {
	w := h.Weight
	if w <= 0 {
		w = 1
	}
	load := math.Max(float64(h.Sessions)/float64(h.SessionLimit), math.Max(h.CPU, h.Mem))
	return math.Floor(20 * load / w)
}

// Pick chooses a host for l among hosts by the rules the database applies
// (eligible: reachable, healthy, not draining, under the session and
// logon limits, and for personal groups the user's own host or a free
// one; then the preferred zone, the lowest load bucket, or the highest
// with depth-first, the fewest pending logons, and chance). It is how a
// broker places launches from its local cache while the database is
// unreachable.
func Pick(hosts []store.Host, l store.Launch, rnd *rand.Rand) (store.Host, bool) {
	owned := false
	if l.Personal {
		for _, h := range hosts {
			if h.AssignedUser == l.User {
				owned = true
			}
		}
	}
	var best store.Host
	var bestKey [4]float64
	found := false
	for _, h := range hosts {
		if h.Group != l.Group || h.LastSeen.Before(l.Stale) || h.Unhealthy != "" || h.AdminDrain || h.AgentDrain ||
			h.Sessions >= h.SessionLimit || h.Pending >= h.LogonLimit {
			continue
		}
		if l.Personal && h.AssignedUser != l.User && (h.AssignedUser != "" || owned) {
			continue
		}
		zone := 1.0
		if h.Zone == l.Zone {
			zone = 0
		}
		b := loadBucket(h)
		if l.Depth {
			b = -b
		}
		key := [4]float64{zone, b, float64(h.Pending), rnd.Float64()}
		if !found || less(key, bestKey) {
			best, bestKey, found = h, key, true
		}
	}
	return best, found
}

func less(a, b [4]float64) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}
