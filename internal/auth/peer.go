package auth

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// PeerAudience is the aud claim of the tokens brokers sharing a database
// ask each other with, so that no gateway token, join token or agent
// credential signed with the same key passes for one.
const PeerAudience = "deskway-broker-peer"

// PeerClaims is what a peer token asserts: the one user (Subject, empty
// for a question about hosts alone) and the hosts a broker asks about.
type PeerClaims struct {
	Hosts []string `json:"hosts,omitempty"`
	jwt.RegisteredClaims
}

// MintPeer returns a token with which a broker asks its peers, which hold
// the same key, about user's sessions and the hosts named: it answers
// for nothing else, and lives ttl.
func (t *Tokens) MintPeer(user string, hosts []string, ttl time.Duration) (string, error) {
	now := t.now()
	id := make([]byte, 12)
	if _, err := rand.Read(id); err != nil {
		return "", fmt.Errorf("auth: token id: %w", err)
	}
	c := PeerClaims{Hosts: hosts, RegisteredClaims: jwt.RegisteredClaims{
		ID:        hex.EncodeToString(id),
		Subject:   user,
		Audience:  jwt.ClaimStrings{PeerAudience},
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(t.key)
	if err != nil {
		return "", fmt.Errorf("auth: sign peer token: %w", err)
	}
	return s, nil
}

// VerifyPeer checks a peer broker's token and returns what it asks about.
func (t *Tokens) VerifyPeer(token string) (*PeerClaims, error) {
	var c PeerClaims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return t.key, nil },
		jwt.WithValidMethods([]string{"HS256"}),
		jwt.WithAudience(PeerAudience),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(t.now),
		jwt.WithLeeway(tokenLeeway),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadToken, err)
	}
	if c.Subject == "" && len(c.Hosts) == 0 {
		return nil, fmt.Errorf("%w: peer token names no user and no host", ErrBadToken)
	}
	return &c, nil
}
