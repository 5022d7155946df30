package auth

import (
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// skewHint is what a refusal for a token's time window adds so that an
// administrator reading the log sees a clock apart from the issuer's
// rather than a bare "token is expired": a freshly minted token refused
// as expired or not yet valid means the two clocks differ by about the
// gap named.
func skewHint(c *Claims, now time.Time, err error) string {
	if c.IssuedAt == nil {
		return ""
	}
	iat := c.IssuedAt.Time
	switch {
	case errors.Is(err, jwt.ErrTokenNotValidYet) || errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return fmt.Sprintf("; it was issued %s ahead of this clock, so the clocks of its issuer (the broker) and of this gateway are at least that far apart: check that both keep time (NTP)",
			iat.Sub(now).Round(time.Second))
	case errors.Is(err, jwt.ErrTokenExpired) && c.ExpiresAt != nil:
		return fmt.Sprintf("; by this clock it was issued %s ago and was valid for %s: if it was used as soon as it was issued, the clocks of its issuer (the broker) and of this gateway are about %s apart: check that both keep time (NTP)",
			now.Sub(iat).Round(time.Second), c.ExpiresAt.Sub(iat).Round(time.Second), now.Sub(iat).Round(time.Second))
	}
	return ""
}
