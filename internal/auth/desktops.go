package auth

import (
	"strings"

	"github.com/deskway/deskway/internal/config"
)

// Desktop is a user's account on the session hosts (auth.desktop_accounts).
type Desktop struct {
	User, Account, Domain, Password string
}

// desktops indexes the desktop accounts by portal user and by account,
// both lower-case.
type desktops struct {
	byUser, byAccount map[string]*Desktop
}

// WithDesktops gives s the desktop accounts of validated config and
// returns s.
func (s *Users) WithDesktops(cfg []config.DesktopAccount) *Users {
	d := &desktops{byUser: map[string]*Desktop{}, byAccount: map[string]*Desktop{}}
	for _, a := range cfg {
		x := &Desktop{User: a.User, Account: a.Account, Domain: a.Domain, Password: a.Password.Value()}
		d.byUser[strings.ToLower(a.User)] = x
		d.byAccount[strings.ToLower(a.Account)] = x
	}
	s.desktops.Store(d)
	return s
}

// Desktop finds the desktop account of a portal user.
func (s *Users) Desktop(user string) (Desktop, bool) {
	d, ok := s.desktops.Load().byUser[strings.ToLower(user)]
	if !ok {
		return Desktop{}, false
	}
	return *d, true
}

// PortalUser names the portal user whose desktop account a session host
// reports; a host user no portal user is mapped to is its own name.
func (s *Users) PortalUser(hostUser string) string {
	if d, ok := s.desktops.Load().byAccount[strings.ToLower(hostUser)]; ok {
		return d.User
	}
	return hostUser
}
