package web

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// signIn is what the sign-in cookie carries: who signed in, when, and
// when they were last seen. The cookie is signed, not encrypted: it holds
// nothing secret, and every portal of a farm with the same key reads it.
type signIn struct {
	// ID names this sign-in; the CSRF token is derived from it.
	ID     string   `json:"id"`
	User   string   `json:"u"`
	Groups []string `json:"g,omitempty"`
	// Issued and Seen are Unix seconds.
	Issued int64 `json:"iat"`
	Seen   int64 `json:"seen"`
	// Via is how they signed in: "" (a local account), "ldap" or "oidc".
	Via string `json:"via,omitempty"`
	// DN is a directory sign-in's entry, read again while it is used;
	// PwdSet is what the entry said at sign-in of when its password was
	// set (see passwordSet): a new password ends the sign-in.
	DN     string `json:"dn,omitempty"`
	PwdSet string `json:"pw,omitempty"`
	// Sub is a provider sign-in's subject.
	Sub string `json:"sub,omitempty"`
}

// cookieCodec signs and checks sign-in cookies and CSRF tokens.
type cookieCodec struct {
	key []byte
}

func (c cookieCodec) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, c.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// encode returns the cookie value for s.
func (c cookieCodec) encode(s signIn) string {
	b, _ := json.Marshal(s)
	body := base64.RawURLEncoding.EncodeToString(b)
	return body + "." + base64.RawURLEncoding.EncodeToString(c.mac("signin", body))
}

var errBadCookie = errors.New("web: the sign-in cookie is not one this portal signed")

// decode checks a cookie value's signature and lifetimes at now.
func (c cookieCodec) decode(v string, now time.Time, idle, max time.Duration) (signIn, error) {
	body, sig, ok := strings.Cut(v, ".")
	if !ok {
		return signIn{}, errBadCookie
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, c.mac("signin", body)) {
		return signIn{}, errBadCookie
	}
	b, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return signIn{}, errBadCookie
	}
	var s signIn
	if err := json.Unmarshal(b, &s); err != nil || s.User == "" || s.ID == "" {
		return signIn{}, errBadCookie
	}
	switch {
	case now.Sub(time.Unix(s.Issued, 0)) > max:
		return signIn{}, errors.New("web: signed in too long ago")
	case now.Sub(time.Unix(s.Seen, 0)) > idle:
		return signIn{}, errors.New("web: idle too long")
	}
	return s, nil
}

// csrf is the token every form of sign-in s posts back.
func (c cookieCodec) csrf(s signIn) string {
	return base64.RawURLEncoding.EncodeToString(c.mac("csrf", s.ID))
}

// checkCSRF reports whether token is s's.
func (c cookieCodec) checkCSRF(s signIn, token string) bool {
	got, err := base64.RawURLEncoding.DecodeString(token)
	return err == nil && hmac.Equal(got, c.mac("csrf", s.ID))
}

// newID is a random sign-in id.
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
