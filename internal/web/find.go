package web

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// searchFrom is how many desktops a user has before the page offers a
// search box: up to it, the whole list fits on a screen.
const searchFrom = 6

// maxQuery bounds a search, which no desktop name comes near.
const maxQuery = 200

// desktopSearch is the desktops page's search box and what it found.
type desktopSearch struct {
	Query string
	// Shown and Total count the desktops that match and all of them.
	Shown, Total int
}

// listed is a desktop as the page shows it: hidden when a search left it
// out. Hidden entries stay in the page so that the search box, with
// script, can widen a search the server narrowed.
type listed struct {
	brokerapi.Desktop
	Hidden bool
}

// arrange orders ds most recently used first, then by name, and marks
// those q does not match; the search is offered once there are
// searchFrom desktops.
func arrange(ds []brokerapi.Desktop, q string) ([]listed, *desktopSearch) {
	slices.SortStableFunc(ds, func(a, b brokerapi.Desktop) int {
		if c := b.LastUsed.Compare(a.LastUsed); c != 0 {
			return c
		}
		return strings.Compare(a.DeliveryGroup, b.DeliveryGroup)
	})
	out := make([]listed, len(ds))
	if len(ds) < searchFrom {
		for i, d := range ds {
			out[i] = listed{Desktop: d}
		}
		return out, nil
	}
	if len(q) > maxQuery {
		q = strings.ToValidUTF8(q[:maxQuery], "")
	}
	q = strings.TrimSpace(q)
	words := strings.Fields(strings.ToLower(q))
	found := &desktopSearch{Query: q, Total: len(ds)}
	for i, d := range ds {
		out[i] = listed{Desktop: d, Hidden: !matches(d, words)}
		if !out[i].Hidden {
			found.Shown++
		}
	}
	return out, found
}

// matches is whether every word is in d's name or description, as
// find.js decides in the browser.
func matches(d brokerapi.Desktop, words []string) bool {
	text := strings.ToLower(d.DeliveryGroup + " " + d.Description)
	for _, w := range words {
		if !strings.Contains(text, w) {
			return false
		}
	}
	return true
}

// lastUsed says when a desktop was last used, for a person.
func lastUsed(t time.Time) string {
	d := time.Since(t)
	n := func(v int, unit string) string {
		if v == 1 {
			return fmt.Sprintf("Last used 1 %s ago.", unit)
		}
		return fmt.Sprintf("Last used %d %ss ago.", v, unit)
	}
	switch {
	case d < time.Minute:
		return "Last used just now."
	case d < time.Hour:
		return n(int(d.Minutes()), "minute")
	case d < 24*time.Hour:
		return n(int(d.Hours()), "hour")
	case d < 7*24*time.Hour:
		return n(int(d.Hours()/24), "day")
	}
	return "Last used on " + t.Local().Format("2 January 2006") + "."
}
