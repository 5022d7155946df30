package site

import (
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/gre"
)

// twoTenants is the e2e tests' gateway: tenants a (key 1001, office at
// 198.51.100.2) and b (key 1002, office at 2001:db8:100::3) with the
// same prefixes.
func twoTenants(t testing.TB, local string) *underlay {
	m := newMetrics(nil)
	var set atomic.Pointer[tenantSet]
	set.Store(&tenantSet{byKey: map[uint32]*tenant{}})
	u := &underlay{local: netip.MustParseAddr(local), set: &set, m: m, log: slog.New(slog.DiscardHandler)}
	for _, c := range []config.Tenant{
		{Name: "a", Key: 1001, Prefixes: []string{"10.0.0.0/24"}, Sites: []config.TenantSite{{Name: "office-a", Peer: "198.51.100.2", Prefixes: []string{"192.168.1.0/24", "fd00:192::/64"}}}},
		{Name: "b", Key: 1002, Prefixes: []string{"10.0.0.0/24"}, Sites: []config.TenantSite{{Name: "office-b", Peer: "2001:db8:100::3", Prefixes: []string{"192.168.1.0/24", "fd00:192::/64"}}}},
	} {
		tn, err := newTenant(&c, m)
		if err != nil {
			t.Fatal(err)
		}
		set.Load().byKey[tn.key] = tn
	}
	return u
}

var peers = []netip.Addr{netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("2001:db8:100::3"), netip.MustParseAddr("198.51.100.66")}

// FuzzDecap: whatever arrives, from a site or not, is dropped or
// delivered to the tenant its key names, from that tenant's site, with
// an inner source of that site's and the inner packet inside the
// datagram; never to another tenant.
func FuzzDecap(f *testing.F) {
	inner, _ := hex.DecodeString("4500001c000100004001af24c0a8010a0a00000a0800f7fd00010001") // 192.168.1.10 → 10.0.0.10
	for _, key := range []uint32{1001, 1002, 7} {
		p := gre.Packet{Header: gre.Header{Protocol: gre.ProtoIPv4, HasKey: true, Key: key}, Payload: inner}
		b, _ := p.Append(make([]byte, 20))
		b[0] = 0x45
		f.Add(b, byte(0))
		f.Add(b[20:], byte(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, who byte) {
		src := peers[int(who)%len(peers)]
		local := "198.51.100.1"
		if src.Is6() {
			local = "2001:db8:100::1"
		}
		u := twoTenants(t, local)
		tn, st, start, end := u.decap(b, src)
		if tn == nil {
			return
		}
		off := 0
		if src.Is4() {
			off = int(b[0]&0x0f) * 4
		}
		var p gre.Packet
		if err := p.Decode(b[off:]); err != nil || !p.HasKey || p.Key != tn.key {
			t.Fatalf("delivered to tenant %s (key %d): GRE %+v, %v", tn.name, tn.key, p.Header, err)
		}
		if tn.c().byPeer[src] != st {
			t.Fatalf("delivered to tenant %s from %s, none of its sites", tn.name, src)
		}
		if start < 0 || end > len(b) || start >= end {
			t.Fatalf("inner packet at [%d:%d] of %d bytes", start, end, len(b))
		}
		pkt := b[start:end]
		if !st.owns(innerSource(pkt)) {
			t.Fatalf("inner source %s is not site %s's", innerSource(pkt), st.name)
		}
		if pkt[0]>>4 == 4 && int(binary.BigEndian.Uint16(pkt[2:])) != len(pkt) {
			t.Fatalf("inner packet cut at %d bytes, its header says %d", len(pkt), binary.BigEndian.Uint16(pkt[2:]))
		}
	})
}
