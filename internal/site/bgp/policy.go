package bgp

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/osrg/gobgp/v4/api"
)

// setPolicies installs the global import and export policies.
//
// Import: with Accept configured, a path is kept only if its prefix lies
// inside one of the accepted prefixes (at that length or longer); every
// other path is rejected before it reaches the RIB, so a tenant cannot
// announce a prefix that hijacks another network's.
//
// Export: only the configured announcements leave the gateway; routes
// learnt from one of the tenant's routers are never passed to another.
func (s *Speaker) setPolicies(ctx context.Context) error {
	if len(s.accept) > 0 {
		if err := s.policy(ctx, "accept", s.accept, true, api.PolicyDirection_POLICY_DIRECTION_IMPORT); err != nil {
			return err
		}
	}
	return s.policy(ctx, "announce", s.announce, false, api.PolicyDirection_POLICY_DIRECTION_EXPORT)
}

// policy defines one prefix set per family from list, a policy accepting
// what matches them (longer: also more specific prefixes inside) and
// assigns it to the global RIB in dir, rejecting the rest.
func (s *Speaker) policy(ctx context.Context, name string, list []netip.Prefix, longer bool, dir api.PolicyDirection) error {
	var statements []*api.Statement
	if dir == api.PolicyDirection_POLICY_DIRECTION_IMPORT {
		// GoBGP runs the global import policy on the gateway's own
		// announcements too; those are not the tenant's to filter.
		statements = append(statements, &api.Statement{
			Name:       name + "-local",
			Conditions: &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL},
			Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT},
		})
	}
	for _, fam := range []struct {
		suffix string
		is4    bool
		bits   uint32
	}{{"-v4", true, 32}, {"-v6", false, 128}} {
		var set []*api.Prefix
		for _, p := range list {
			if p.Addr().Is4() != fam.is4 {
				continue
			}
			maxLen := uint32(p.Bits())
			if longer {
				maxLen = fam.bits
			}
			set = append(set, &api.Prefix{IpPrefix: p.String(), MaskLengthMin: uint32(p.Bits()), MaskLengthMax: maxLen})
		}
		if len(set) == 0 {
			continue
		}
		setName := name + fam.suffix
		if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
			DefinedType: api.DefinedType_DEFINED_TYPE_PREFIX,
			Name:        setName,
			Prefixes:    set,
		}}); err != nil {
			return fmt.Errorf("prefix set %s: %w", setName, err)
		}
		statements = append(statements, &api.Statement{
			Name:       setName,
			Conditions: &api.Conditions{PrefixSet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: setName}},
			Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_ACCEPT},
		})
	}
	assignment := &api.PolicyAssignment{
		Name:          "global",
		Direction:     dir,
		DefaultAction: api.RouteAction_ROUTE_ACTION_REJECT,
	}
	if len(statements) > 0 {
		pol := &api.Policy{Name: name, Statements: statements}
		if err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: pol}); err != nil {
			return fmt.Errorf("policy %s: %w", name, err)
		}
		assignment.Policies = []*api.Policy{{Name: name}}
	}
	if err := s.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: assignment}); err != nil {
		return fmt.Errorf("assign policy %s: %w", name, err)
	}
	return nil
}
