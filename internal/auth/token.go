package auth

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TokenAudience is the aud claim of gateway access tokens, so a token made
// for another purpose with the same key is refused.
const TokenAudience = "deskway-gateway"

// Claims is what a PAA token asserts: this user may reach this host:port
// until it expires. Any gateway holding the key can check it alone.
type Claims struct {
	Groups []string `json:"grp,omitempty"`
	Host   string   `json:"host"`
	Port   int      `json:"port"`
	jwt.RegisteredClaims
}

// User returns the subject.
func (c *Claims) User() string { return c.Subject }

// Tokens mints and verifies HMAC-SHA256 signed tokens (JWT, RFC 7519).
type Tokens struct {
	key []byte
	now func() time.Time
}

// NewTokens returns a signer and verifier for key (at least 32 bytes).
func NewTokens(key []byte, now func() time.Time) (*Tokens, error) {
	if len(key) < 32 {
		return nil, fmt.Errorf("auth: token key is %d bytes, need at least 32", len(key))
	}
	if now == nil {
		now = time.Now
	}
	return &Tokens{key: append([]byte(nil), key...), now: now}, nil
}

// Mint returns a token for user to reach host:port, valid for ttl, with
// a random id (jti) by which gateways count its uses.
func (t *Tokens) Mint(user string, groups []string, host string, port int, ttl time.Duration) (string, error) {
	now := t.now()
	idb := make([]byte, 16)
	if _, err := rand.Read(idb); err != nil {
		return "", fmt.Errorf("auth: token id: %w", err)
	}
	id := hex.EncodeToString(idb)
	c := Claims{
		Groups: groups,
		Host:   strings.ToLower(host),
		Port:   port,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   user,
			Audience:  jwt.ClaimStrings{TokenAudience},
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now.Add(-30 * time.Second)),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
			ID:        id,
		},
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(t.key)
	if err != nil {
		return "", fmt.Errorf("auth: sign token: %w", err)
	}
	return s, nil
}

// ErrBadToken wraps every reason a token is refused.
var ErrBadToken = errors.New("auth: token refused")

// Verify checks signature, audience and validity window.
func (t *Tokens) Verify(token string) (*Claims, error) {
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return t.key, nil },
		jwt.WithValidMethods([]string{"HS256"}),
		jwt.WithAudience(TokenAudience),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(t.now),
		jwt.WithLeeway(5*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %v%s", ErrBadToken, err, skewHint(&c, t.now(), err))
	}
	if c.Subject == "" || c.Host == "" || c.Port < 1 || c.Port > 65535 {
		return nil, fmt.Errorf("%w: missing subject, host or port", ErrBadToken)
	}
	return &c, nil
}
