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

// ErrTokenExpired is among the reasons Verify gives when a token is
// genuine but past its expiry, which VerifyExpired then accepts.
var ErrTokenExpired = jwt.ErrTokenExpired

// tokenLeeway is the clock skew between broker and gateway a token's
// times are checked with.
const tokenLeeway = 5 * time.Second

// Verify checks signature, audience and validity window.
func (t *Tokens) Verify(token string) (*Claims, error) {
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return t.key, nil },
		jwt.WithValidMethods([]string{"HS256"}),
		jwt.WithAudience(TokenAudience),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(t.now),
		jwt.WithLeeway(tokenLeeway),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %w%s", ErrBadToken, err, skewHint(&c, t.now(), err))
	}
	return checkClaims(&c)
}

// VerifyExpired checks a token as Verify does except for its expiry: it
// returns the claims of a genuine token even once it has expired. It is
// for a gateway granting the reconnect of a tunnel the token opened
// while valid; whether the token earned one is the gateway's record to
// say, never this.
func (t *Tokens) VerifyExpired(token string) (*Claims, error) {
	var c Claims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return t.key, nil },
		jwt.WithValidMethods([]string{"HS256"}),
		jwt.WithoutClaimsValidation(),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadToken, err)
	}
	if c.ExpiresAt == nil {
		return nil, fmt.Errorf("%w: no expiry", ErrBadToken)
	}
	// Every check but expiry, as of now: audience, not-before, issued-at.
	v := jwt.NewValidator(jwt.WithAudience(TokenAudience), jwt.WithTimeFunc(t.now), jwt.WithLeeway(tokenLeeway),
		jwt.WithIssuedAt())
	exp := c.ExpiresAt
	c.ExpiresAt = nil
	err = v.Validate(&c)
	c.ExpiresAt = exp
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadToken, err)
	}
	return checkClaims(&c)
}

func checkClaims(c *Claims) (*Claims, error) {
	if c.Subject == "" || c.Host == "" || c.Port < 1 || c.Port > 65535 {
		return nil, fmt.Errorf("%w: missing subject, host or port", ErrBadToken)
	}
	return c, nil
}
