// Package auth holds the local user store, the NTLMv2 server used for HTTP
// authentication at the gateway, signed PAA tokens, and login throttling.
package auth

import (
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"

	"golang.org/x/crypto/md4" //nolint:staticcheck // NTLM is defined over MD4; there is no alternative.

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/ntlm"
)

// User is a local account.
type User struct {
	Name   string
	Groups []string
	// Zone is the user's home zone; the broker prefers hosts there.
	Zone   string
	ntHash [16]byte
}

// CheckPassword reports whether password is the user's, in constant time.
func (u *User) CheckPassword(password string) bool {
	h := NTHash(password)
	return subtle.ConstantTimeCompare(h[:], u.ntHash[:]) == 1
}

// Users is the local user store, keyed by lower-case name. A reload of
// the configuration replaces its contents while it is in use.
type Users struct {
	byName   atomic.Pointer[map[string]*User]
	desktops atomic.Pointer[desktops]
}

// NTHash returns MD4 of the UTF-16LE password, the key NTLM is built on.
func NTHash(password string) [16]byte {
	h := md4.New()
	h.Write(ntlm.EncodeUTF16(password))
	var out [16]byte
	copy(out[:], h.Sum(nil))
	return out
}

// NewUsers builds the store from validated config.
func NewUsers(cfg []config.User) (*Users, error) {
	byName := make(map[string]*User, len(cfg))
	for _, u := range cfg {
		nu := &User{Name: u.Name, Groups: append([]string(nil), u.Groups...), Zone: u.Zone}
		if u.NTHash.IsSet() {
			b, err := hex.DecodeString(u.NTHash.Value())
			if err != nil || len(b) != 16 {
				return nil, fmt.Errorf("auth: user %s: nt_hash is not 32 hex digits", u.Name)
			}
			copy(nu.ntHash[:], b)
		} else {
			nu.ntHash = NTHash(u.Password.Value())
		}
		byName[strings.ToLower(u.Name)] = nu
	}
	s := &Users{}
	s.byName.Store(&byName)
	s.desktops.Store(&desktops{})
	return s, nil
}

// Replace gives s the users and desktop accounts of n: lookups from now
// on see n's, and one already made keeps the user it found.
func (s *Users) Replace(n *Users) {
	s.byName.Store(n.byName.Load())
	s.desktops.Store(n.desktops.Load())
}

// Lookup finds a user by name, ignoring case as Windows does. A name given
// as DOMAIN\user or user@domain is reduced to the user part.
func (s *Users) Lookup(name string) (*User, bool) {
	u, ok := (*s.byName.Load())[strings.ToLower(BareName(name))]
	return u, ok
}

// BareName strips a DOMAIN\ prefix or an @domain suffix.
func BareName(name string) string {
	if i := strings.LastIndexByte(name, '\\'); i >= 0 {
		name = name[i+1:]
	}
	if i := strings.IndexByte(name, '@'); i >= 0 {
		name = name[:i]
	}
	return name
}
