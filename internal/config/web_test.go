package config

import (
	"strings"
	"testing"
)

// TestConsoleCredential: the console acts with a console token, never
// an admin token (whose requests name nobody); left empty with this
// config's admin API, the process makes one.
func TestConsoleCredential(t *testing.T) {
	const base = "auth:\n  token_key: 0123456789abcdef0123456789abcdef\nbroker:\n  listen: \":9444\"\n  gateway: gw:443\n  frontend_tokens: [ft-0123456789]\n  delivery_groups:\n  - {name: desk, groups: [staff]}\n"
	const web = "web:\n  console: {admins: [ops]%s}\n"
	for _, tc := range []struct{ admin, console, want string }{
		{"admin:\n  tokens: [op-token]\n", "", ""},
		{"admin:\n  tokens: [op-token]\n  console_tokens: [con-token]\n", "", ""},
		{"admin:\n  tokens: [op-token]\n", ", token: op-token", "web.console.token (line 12): is one of admin.tokens"},
		{"admin:\n  tokens: [op-token]\n", ", token: other", "web.console.token (line 12): is not one of admin.console_tokens"},
		{"admin:\n  tokens: [op-token]\n", ", api: \"https://admin.example:9443\"", "web.console.token (not set; its section is on line 12): is empty"},
		{"admin:\n  tokens: [op-token]\n", ", api: \"https://admin.example:9443\", token: remote-console", ""},
		{"admin:\n  tokens: [op-token]\n  console_tokens: [op-token]\n", "", "admin.console_tokens[0] (line 3): is also in admin.tokens"},
	} {
		in := tc.admin + base + strings.Replace(web, "%s", tc.console, 1)
		c, err := Parse([]byte(in))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", in, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: got %v, want an error with %q", in, err, tc.want)
		case tc.want == "" && strings.Contains(tc.admin, "console_tokens") && c.Web.Console.Token.Value() != "con-token":
			t.Errorf("%q: the console's token defaults to %q", in, c.Web.Console.Token.Value())
		}
	}
}

// TestOIDCNamesStayTheProviders: a mapping target named USER@NAMESPACE
// would take a provider user's name. (Local account names hold no @.)
func TestOIDCNamesStayTheProviders(t *testing.T) {
	const base = "auth:\n  token_key: 0123456789abcdef0123456789abcdef\n  users:\n  - {name: %s, password: Pass-Word-1}\nbroker:\n  listen: \":9444\"\n  gateway: gw:443\n  frontend_tokens: [ft-0123456789]\n  delivery_groups:\n  - {name: desk, groups: [staff]}\n" +
		"web:\n  public_url: https://portal.example\n  oidc:\n    issuer: https://idp.example\n    client_id: portal\n    client_secret: s3cret\n    accounts: {sub-1: %s}\n"
	for _, tc := range []struct{ user, target, want string }{
		{"alice", "carol", ""},
		{"alice", "carol@IDP.example", `web.oidc.accounts (line 17): "sub-1": "carol@IDP.example" ends in @idp.example`},
		{"alice", "[carol, dave]", "web.oidc.accounts.sub-1 (line 17): want a string, got a list"},
	} {
		in := strings.Replace(strings.Replace(base, "%s", tc.user, 1), "%s", tc.target, 1)
		_, err := Parse([]byte(in))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s, %s: %v", tc.user, tc.target, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s, %s: got %v, want an error with %q", tc.user, tc.target, err, tc.want)
		}
	}
}
