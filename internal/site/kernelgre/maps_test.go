package kernelgre

import (
	"net/netip"
	"testing"
)

// TestPrefixKey: an LPM key counts the index's and the family's bits
// before the prefix's, and holds the prefix masked, so a lookup of a
// host's full key matches it and nothing of another index or family.
func TestPrefixKey(t *testing.T) {
	k := prefixKey(7, netip.MustParsePrefix("192.168.1.77/24"))
	if k.Bits != 32+8+24 || k.Index != 7 || k.Family != 4 || k.Addr != [16]uint8{192, 168, 1, 0} {
		t.Fatalf("IPv4 key %+v", k)
	}
	k = prefixKey(3, netip.MustParsePrefix("fd00:192::1/64"))
	want := netip.MustParseAddr("fd00:192::").As16()
	if k.Bits != 32+8+64 || k.Family != 6 || k.Addr != want {
		t.Fatalf("IPv6 key %+v", k)
	}
	// The programs compare addresses as loaded from the packet: network
	// order in memory, read as a little-endian word.
	if got := be32(netip.MustParseAddr("198.51.100.1")); got != 0x016433c6 {
		t.Fatalf("be32 = %#x", got)
	}
}
