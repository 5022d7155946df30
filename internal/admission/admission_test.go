package admission

import (
	"net/netip"
	"strings"
	"testing"
)

func TestCaps(t *testing.T) {
	l := New(3, 2)
	a := netip.MustParseAddr("192.0.2.1")
	k1, why := l.Admit(a, "the server")
	if why != "" {
		t.Fatal(why)
	}
	if _, why := l.Admit(a, "the server"); why != "" {
		t.Fatal(why)
	}
	if _, why := l.Admit(a, "the server"); !strings.Contains(why, "address") {
		t.Fatalf("third from one address: %q", why)
	}
	// An IPv6 host owns its /64: two addresses in it share one cap.
	v6a, v6b := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	if _, why := l.Admit(v6a, "the server"); why != "" {
		t.Fatal(why)
	}
	if _, why := l.Admit(v6b, "the server"); !strings.Contains(why, "the server holds its maximum") {
		t.Fatalf("fourth in all: %q", why)
	}
	l.Release(k1)
	if l.Count() != 2 {
		t.Fatalf("count %d after a release", l.Count())
	}
	if _, why := l.Admit(v6b, "the server"); why != "" {
		t.Fatalf("after a release: %q", why)
	}
	if _, why := l.Admit(v6a, "the server"); !strings.Contains(why, "maximum") {
		t.Fatalf("a /64 past its cap: %q", why)
	}
}
