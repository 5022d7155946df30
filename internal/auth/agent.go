package auth

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Audiences of the broker's agent tokens: a join token lets an agent
// register a host into one delivery group; the credential the broker hands
// back lets it report for that host only.
const (
	JoinAudience  = "deskway-join"
	AgentAudience = "deskway-agent"
)

// AgentClaims is what join tokens and agent credentials assert.
type AgentClaims struct {
	Group string `json:"grp"`
	Zone  string `json:"zone,omitempty"`
	// Uses is how many hosts a join token may register; 0 is no limit.
	// The broker counts uses by the token's ID in its database, so the
	// limit holds across brokers sharing it.
	Uses int `json:"uses,omitempty"`
	// Registration names the join of the host an agent credential is for:
	// the broker refuses it once that host is removed, even if a host of
	// the same name joins again.
	Registration string `json:"reg,omitempty"`
	jwt.RegisteredClaims
}

// MintJoin returns a join token for group (and zone, if set), valid for
// ttl, that registers at most uses new hosts (0: any number).
func (t *Tokens) MintJoin(group, zone string, ttl time.Duration, uses int) (string, error) {
	return t.mintAgent(JoinAudience, "", group, zone, "", ttl, uses)
}

// MintAgent returns the credential host (of group, in zone, joined as
// registration) reports and re-registers with.
func (t *Tokens) MintAgent(host, group, zone, registration string, ttl time.Duration) (string, error) {
	return t.mintAgent(AgentAudience, host, group, zone, registration, ttl, 0)
}

func (t *Tokens) mintAgent(aud, sub, group, zone, registration string, ttl time.Duration, uses int) (string, error) {
	now := t.now()
	id := make([]byte, 12)
	if _, err := rand.Read(id); err != nil {
		return "", fmt.Errorf("auth: token id: %w", err)
	}
	c := AgentClaims{Group: group, Zone: zone, Uses: uses, Registration: registration, RegisteredClaims: jwt.RegisteredClaims{
		ID:        hex.EncodeToString(id),
		Subject:   sub,
		Audience:  jwt.ClaimStrings{aud},
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(t.key)
	if err != nil {
		return "", fmt.Errorf("auth: sign %s token: %w", aud, err)
	}
	return s, nil
}

// RenewAgent mints a fresh credential with the claims of an agent
// credential this key signed, expired or not. Only the holder of the key
// can do this, as it could mint any credential: deskway up uses it for its
// own host, whose credential expires while the demo is not running.
func (t *Tokens) RenewAgent(old string, ttl time.Duration) (string, error) {
	var c AgentClaims
	_, err := jwt.ParseWithClaims(old, &c, func(*jwt.Token) (any, error) { return t.key, nil },
		jwt.WithValidMethods([]string{"HS256"}), jwt.WithoutClaimsValidation())
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadToken, err)
	}
	if len(c.Audience) != 1 || c.Audience[0] != AgentAudience || c.Subject == "" || c.Group == "" {
		return "", fmt.Errorf("%w: not an agent credential", ErrBadToken)
	}
	return t.MintAgent(c.Subject, c.Group, c.Zone, c.Registration, ttl)
}

// VerifyJoin checks a join token.
func (t *Tokens) VerifyJoin(token string) (*AgentClaims, error) {
	return t.verifyAgent(JoinAudience, token)
}

// VerifyAgent checks an agent credential; its subject is the host.
func (t *Tokens) VerifyAgent(token string) (*AgentClaims, error) {
	c, err := t.verifyAgent(AgentAudience, token)
	if err == nil && c.Subject == "" {
		return nil, fmt.Errorf("%w: agent credential names no host", ErrBadToken)
	}
	return c, err
}

func (t *Tokens) verifyAgent(aud, token string) (*AgentClaims, error) {
	var c AgentClaims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return t.key, nil },
		jwt.WithValidMethods([]string{"HS256"}),
		jwt.WithAudience(aud),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(t.now),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadToken, err)
	}
	if c.Group == "" {
		return nil, fmt.Errorf("%w: no delivery group", ErrBadToken)
	}
	if aud == JoinAudience && c.ID == "" {
		return nil, fmt.Errorf("%w: join token has no id; mint a new one", ErrBadToken)
	}
	return &c, nil
}
