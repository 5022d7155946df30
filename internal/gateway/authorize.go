package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proto/tsgu"
)

// authorize settles who the client is (its HTTP login, or the PAA token
// in cookie) and which connection policy admits it, and counts the
// tunnel against the gateway's and the user's caps. Refusals carry pkt,
// the packet they answer.
func (tn *tunnel) authorize(pkt tsgu.PacketType, cookie *string) error {
	s := tn.srv
	id := policy.Identity{Method: tn.hs.method, Source: tn.hs.remote}
	if tn.hs.user != nil {
		id.User, id.Groups = tn.hs.user.Name, tn.hs.user.Groups
	}
	if tn.hs.method == policy.MethodPAA || cookie != nil && s.deps.Tokens != nil {
		if cookie == nil {
			return &refusal{pkt, tsgu.EProxyCookieBadPacket, "PAA cookie missing"}
		}
		if s.deps.Tokens == nil {
			return &refusal{pkt, tsgu.EProxyCookieAuthenticationDenied, "this gateway takes no tokens (auth.token_key is not set)"}
		}
		c, expired, err := tn.verifyToken(strings.TrimSpace(*cookie))
		if err != nil {
			s.metrics.auth.WithLabelValues(policy.MethodPAA, "failed").Inc()
			s.deps.Throttle.Fail("", tn.hs.remote)
			return &refusal{pkt, tsgu.EProxyCookieAuthenticationDenied, err.Error()}
		}
		if tn.hs.user != nil && !strings.EqualFold(tn.hs.user.Name, c.User()) {
			return &refusal{pkt, tsgu.EProxyCookieAuthenticationDenied, fmt.Sprintf("token is for %s, HTTP login is %s", c.User(), tn.hs.user.Name)}
		}
		var end func(UseEnd)
		if expired != nil {
			// The reconnect grant: the tunnel still goes through every
			// policy below, and its channel to the token's target alone.
			end, err = s.deps.TokenUses.Reconnect(c.ID, tn.hs.remote)
		} else {
			end, err = s.deps.TokenUses.Begin(c.ID, c.ExpiresAt.Time, tn.hs.remote)
		}
		if err != nil && expired != nil {
			// Counted as the expired token it is, as before the grant,
			// but for a reconnect that came while its old tunnel was
			// still held: the client's retries then are no guesses.
			s.metrics.auth.WithLabelValues(policy.MethodPAA, "failed").Inc()
			if !errors.As(err, new(inUseError)) {
				s.deps.Throttle.Fail("", tn.hs.remote)
			}
			// Verify's reason says how far apart the clocks look, which
			// is what to fix when a fresh token is refused as expired.
			return &refusal{pkt, tsgu.EProxyCookieAuthenticationDenied, fmt.Sprintf("expired token of %s refused: %v (%v)", c.User(), err, expired)}
		}
		if err != nil {
			s.metrics.auth.WithLabelValues(policy.MethodPAA, "replayed").Inc()
			return &refusal{pkt, tsgu.EProxyCookieAuthenticationDenied, fmt.Sprintf("token of %s refused: %v", c.User(), err)}
		}
		tn.tokenEnd = end
		if expired != nil {
			tn.log.Info("expired token's reconnect granted: its last tunnel closed within gateway.reconnect_window", "user", c.User(), "expired", c.ExpiresAt.Time)
		}
		s.metrics.auth.WithLabelValues(policy.MethodPAA, "ok").Inc()
		tn.claims = c
		if tn.hs.user == nil {
			id.User, id.Groups = c.User(), c.Groups
			if u, ok := s.deps.Users.Lookup(c.User()); ok {
				id.Groups = mergeGroups(id.Groups, u.Groups)
			}
		}
	}
	tn.ident = id
	if tn.hs.user == nil {
		tn.log = tn.log.With("user", id.User) // known from the token only now
	}
	if s.deps.Authorizer != nil {
		// RADIUS may add groups, so it is asked before the CAPs when configured.
		g, err := s.deps.Authorizer.Authorize(context.Background(), id)
		if err != nil {
			return &refusal{pkt, tsgu.EProxyNAPAccessDenied, "central policy: " + err.Error()}
		}
		tn.ident.Groups = mergeGroups(tn.ident.Groups, g)
	}
	grant, err := s.policy.Load().Connect(tn.ident)
	if err != nil {
		var d *policy.Denied
		if errors.As(err, &d) {
			return &refusal{pkt, d.Code, d.Reason}
		}
		return &refusal{pkt, tsgu.EProxyInternalError, err.Error()}
	}
	tn.grant = grant
	s.mu.Lock()
	switch {
	case s.open >= s.cfg.MaxTunnels:
		s.mu.Unlock()
		return &refusal{pkt, tsgu.EProxyMaxConnectionsReached, fmt.Sprintf("gateway holds its maximum of %d tunnels", s.cfg.MaxTunnels)}
	case grant.MaxTunnelsPerUser > 0 && s.perUser[id.User] >= grant.MaxTunnelsPerUser:
		s.mu.Unlock()
		return &refusal{pkt, tsgu.EProxyMaxConnectionsReached, fmt.Sprintf("%s already has %d tunnels (policy %s allows %d)", id.User, s.perUser[id.User], grant.Policy, grant.MaxTunnelsPerUser)}
	}
	s.perUser[id.User]++
	s.open++
	tn.counted = true
	s.mu.Unlock()
	return nil
}

// mergeGroups is a and the groups of b it lacks, compared as Windows
// compares group names (case-insensitively).
func mergeGroups(a, b []string) []string {
	out := append([]string(nil), a...)
	for _, g := range b {
		dup := false
		for _, x := range out {
			if strings.EqualFold(x, g) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, g)
		}
	}
	return out
}
