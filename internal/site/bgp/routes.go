package bgp

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// reconcileLoop owns the set of routes handed to the sink. On each kick
// (a best-path change or a peer's state change) it reads GoBGP's RIB and
// brings the sink in line: reading the whole table, rather than replaying
// events one by one, cannot miss a withdrawal, a peer's loss or a changed
// next hop. A tenant's table is small and bounded by the prefix limits.
// When the speaker stops, every route it added is removed.
func (s *Speaker) reconcileLoop(ctx context.Context) {
	defer close(s.done)
	installed := map[netip.Prefix]netip.Addr{}
	defer func() {
		for p := range installed {
			s.opt.Sink.Remove(p)
		}
		s.m.received.Set(0)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		want, err := s.learnt()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("bgp: read the routing table", "err", err)
			continue
		}
		for p := range installed {
			if _, ok := want[p]; !ok {
				s.opt.Sink.Remove(p)
				delete(installed, p)
				s.log.Debug("bgp route removed", "prefix", p)
			}
		}
		for p, nh := range want {
			if old, ok := installed[p]; !ok || old != nh {
				s.opt.Sink.Add(p, nh)
				installed[p] = nh
				s.log.Debug("bgp route added", "prefix", p, "next_hop", nh)
			}
		}
		s.m.received.Set(float64(len(installed)))
	}
}

// learnt returns the best path of every prefix a peer taught the gateway
// (not the gateway's own announcements), IPv4 and IPv6 unicast.
func (s *Speaker) learnt() (map[netip.Prefix]netip.Addr, error) {
	want := map[netip.Prefix]netip.Addr{}
	for _, fam := range []bgp.Family{bgp.RF_IPv4_UC, bgp.RF_IPv6_UC} {
		err := s.srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: fam},
			func(nlri bgp.NLRI, paths []*apiutil.Path) {
				for _, p := range paths {
					if !p.Best || p.Withdrawal || !p.PeerAddress.IsValid() {
						continue // a local path has no peer address: our own announcement
					}
					prefix, ok := nlriPrefix(nlri)
					nh, ok2 := nextHop(p)
					if ok && ok2 {
						want[prefix] = nh
					}
				}
			})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", fam, err)
		}
	}
	return want, nil
}

func nlriPrefix(n bgp.NLRI) (netip.Prefix, bool) {
	if p, ok := n.(*bgp.IPAddrPrefix); ok && p.Prefix.IsValid() {
		return p.Prefix.Masked(), true
	}
	return netip.Prefix{}, false
}

// nextHop is the path's global next hop: NEXT_HOP for IPv4, the
// MP_REACH_NLRI next hop for IPv6. A link-local-only next hop is no use
// without its interface, which BGP does not carry.
func nextHop(p *apiutil.Path) (netip.Addr, bool) {
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeNextHop:
			if a.Value.IsValid() && !a.Value.IsUnspecified() {
				return a.Value, true
			}
		case *bgp.PathAttributeMpReachNLRI:
			if a.Nexthop.IsValid() && !a.Nexthop.IsUnspecified() && !a.Nexthop.IsLinkLocalUnicast() {
				return a.Nexthop, true
			}
		}
	}
	return netip.Addr{}, false
}
