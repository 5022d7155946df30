package gateway

import "github.com/deskway/deskway/internal/proto/x224"

// desktopCredentials are the desktop account (auth.desktop_accounts) of
// the user the tunnel's token was minted for, which the gateway logs the
// browser session on with: the browser never holds the password, and
// what the browser sent cannot choose another account. Nil when the
// tunnel was not opened with a token or the user has no such account.
func (tn *tunnel) desktopCredentials() *x224.Credentials {
	if tn.claims == nil || tn.srv.deps.Users == nil {
		return nil
	}
	d, ok := tn.srv.deps.Users.Desktop(tn.claims.User())
	if !ok {
		return nil
	}
	return &x224.Credentials{Domain: d.Domain, User: d.Account, Password: d.Password}
}
