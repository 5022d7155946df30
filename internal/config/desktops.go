package config

import (
	"fmt"
	"strings"
)

// validateDesktopAccounts checks auth.desktop_accounts: each portal user
// and each host account appears once, so that a host's report of an
// account names one user and a user's logon names one account.
func validateDesktopAccounts(accts []DesktopAccount, bad func(key, format string, a ...any)) {
	users, accounts := map[string]bool{}, map[string]bool{}
	for i, d := range accts {
		key := fmt.Sprintf("auth.desktop_accounts[%d]", i)
		if d.User == "" || strings.ContainsAny(d.User, `\@/ `) {
			bad(key+".user", "%q is empty or has one of \\ @ / or a space", d.User)
		}
		if !hostAccountName(d.Account) {
			bad(key+".account", "%q is not a host user name (letters, digits, . _ -, at most 256)", d.Account)
		}
		if d.Domain != "" && !hostAccountName(d.Domain) {
			bad(key+".domain", "%q is not a domain name (letters, digits, . _ -, at most 256)", d.Domain)
		}
		if !d.Password.IsSet() || d.Password.Value() == "" {
			bad(key+".password", "is missing: the gateway logs the user on with it")
		} else if len(d.Password.Value()) > 256 || strings.ContainsRune(d.Password.Value(), 0) {
			bad(key+".password", "is longer than 256 characters or holds a NUL")
		}
		if u := strings.ToLower(d.User); users[u] {
			bad(key+".user", "%q has another desktop account already", d.User)
		} else {
			users[u] = true
		}
		if a := strings.ToLower(d.Account); accounts[a] {
			bad(key+".account", "%q is another user's desktop account already: a host's session of it would be both users'", d.Account)
		} else {
			accounts[a] = true
		}
	}
}

// hostAccountName keeps names an RDP Client Info PDU and a Unix user
// name both hold.
func hostAccountName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
