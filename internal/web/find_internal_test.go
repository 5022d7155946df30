package web

import (
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// TestArrange: most recently used first, then by name; the search only
// from searchFrom desktops, every word in the name or description, any
// case.
func TestArrange(t *testing.T) {
	now := time.Now()
	ds := []brokerapi.Desktop{{DeliveryGroup: "accounts"}, {DeliveryGroup: "cad", Description: "Drawing office, 3D CAD"},
		{DeliveryGroup: "desk", Description: "Office desktop", LastUsed: now.Add(-time.Hour)}, {DeliveryGroup: "billing"},
		{DeliveryGroup: "lab", LastUsed: now}}
	order := func(ls []listed) string {
		var names []string
		for _, l := range ls {
			if !l.Hidden {
				names = append(names, l.DeliveryGroup)
			}
		}
		return strings.Join(names, " ")
	}
	ls, find := arrange(ds, "office")
	if got := order(ls); got != "lab desk accounts billing cad" || find != nil {
		t.Fatalf("five desktops: %q, search %+v", got, find)
	}
	ds = append(ds, brokerapi.Desktop{DeliveryGroup: "build"})
	for q, want := range map[string]string{"": "lab desk accounts billing build cad", " OFFICE ": "desk cad", "office 3d": "cad", "nothing": ""} {
		ls, find = arrange(ds, q)
		if got := order(ls); got != want || find == nil || find.Total != 6 || find.Shown != len(strings.Fields(want)) || find.Query != strings.TrimSpace(q) {
			t.Errorf("search %q: %q, %+v; want %q", q, got, find, want)
		}
	}
}

func TestLastUsedWords(t *testing.T) {
	now := time.Now()
	for ago, want := range map[time.Duration]string{10 * time.Second: "Last used just now.", 90 * time.Second: "Last used 1 minute ago.",
		5 * time.Minute: "Last used 5 minutes ago.", 3 * time.Hour: "Last used 3 hours ago.", 50 * time.Hour: "Last used 2 days ago."} {
		if got := lastUsed(now.Add(-ago)); got != want {
			t.Errorf("%v ago: %q, want %q", ago, got, want)
		}
	}
	if got := lastUsed(time.Date(2026, 3, 4, 10, 0, 0, 0, time.Local)); got != "Last used on 4 March 2026." {
		t.Errorf("in March: %q", got)
	}
}
