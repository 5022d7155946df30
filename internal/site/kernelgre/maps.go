package kernelgre

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// Sync makes the maps hold exactly the tenants and tunnels given: it
// writes every entry first and deletes the ones no longer wanted after,
// so a tunnel that stays forwards throughout a reload.
func (d *Datapath) Sync(tenants []Tenant, tunnels []Tunnel) error {
	byTenant := map[uint32]Tenant{}
	wantTenants := map[uint32]uint32{}
	for _, t := range tenants {
		if t.Index >= MaxTunnels || len(t.LocalMAC) != 6 || len(t.PeerMAC) != 6 {
			return fmt.Errorf("tenant %d: index or hardware addresses out of range", t.Index)
		}
		byTenant[t.Index] = t
		wantTenants[uint32(t.Ifindex)] = t.Index
	}
	wantIn := map[greTunnelKey]greTunnelIn{}
	wantSources := map[grePrefixKey]uint8{}
	wantRoutes := map[grePrefixKey]greTunnelOut{}
	for _, tu := range tunnels {
		te, ok := byTenant[tu.Tenant]
		if !ok || tu.Index >= MaxTunnels || !tu.Local.Is4() || !tu.Peer.Is4() {
			return fmt.Errorf("tunnel %d: no tenant %d, index out of range or not IPv4", tu.Index, tu.Tenant)
		}
		in := greTunnelIn{Tunnel: tu.Index, Ifindex: uint32(te.Ifindex)}
		copy(in.DstMac[:], te.PeerMAC)
		copy(in.SrcMac[:], te.LocalMAC)
		wantIn[greTunnelKey{Peer: be32(tu.Peer), Local: be32(tu.Local), Key: tu.Key}] = in
		for _, p := range tu.Sources {
			wantSources[prefixKey(tu.Index, p)] = 1
		}
		out := greTunnelOut{Local: be32(tu.Local), Peer: be32(tu.Peer), Key: tu.Key, Ifindex: uint32(tu.Underlay), Tunnel: tu.Index}
		for _, p := range tu.Routes {
			wantRoutes[prefixKey(tu.Tenant, p)] = out
		}
	}
	return errors.Join(
		sync(d.objs.Tenants, wantTenants),
		sync(d.objs.TunnelsIn, wantIn),
		sync(d.objs.SiteSources, wantSources),
		sync(d.objs.Routes, wantRoutes),
	)
}

// sync puts every entry of want into m, then deletes m's other keys.
func sync[K comparable, V any](m *ebpf.Map, want map[K]V) error {
	for k, v := range want {
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("map %s: %w", m.String(), err)
		}
	}
	var stale []K
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("map %s: %w", m.String(), err)
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("map %s: %w", m.String(), err)
		}
	}
	return nil
}

// be32 is an IPv4 address as the programs compare it: its bytes in
// network order read as a little-endian word.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// prefixKey is p under index as an LPM key.
func prefixKey(index uint32, p netip.Prefix) grePrefixKey {
	p = p.Masked()
	k := grePrefixKey{Index: index, Family: 6, Bits: uint32(32 + 8 + p.Bits())}
	if p.Addr().Is4() {
		k.Family = 4
		a := p.Addr().As4()
		copy(k.Addr[:], a[:])
	} else {
		a := p.Addr().As16()
		copy(k.Addr[:], a[:])
	}
	return k
}
