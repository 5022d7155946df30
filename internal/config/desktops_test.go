package config

import (
	"strings"
	"testing"
)

// TestDesktopAccounts: each portal user and each host account is mapped
// once, with a password, and the mistakes name their key.
func TestDesktopAccounts(t *testing.T) {
	base := "auth:\n  desktop_accounts:\n"
	good := base + "  - {user: demo, account: deskway-demo, password: pw1}\n  - {user: alice, account: alice, domain: CORP, password: pw2}\n"
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Auth.DesktopAccounts[0]; d.User != "demo" || d.Account != "deskway-demo" || d.Password.Value() != "pw1" {
		t.Fatalf("parsed %+v", d)
	}
	for body, want := range map[string]string{
		"  - {user: demo, account: deskway-demo}\n":                                               "auth.desktop_accounts[0].password",
		"  - {user: demo, account: 'a b', password: x}\n":                                         "auth.desktop_accounts[0].account",
		"  - {user: demo, account: a, password: x}\n  - {user: DEMO, account: b, password: y}\n":  "has another desktop account",
		"  - {user: demo, account: a, password: x}\n  - {user: alice, account: A, password: y}\n": "another user's desktop account",
		"  - {user: '', account: a, password: x}\n":                                               "auth.desktop_accounts[0].user",
	} {
		_, err := Parse([]byte(base + body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}
