package web

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/deskway/deskway/internal/config"
)

// TestConsoleActorKeepsTheNamespace: the name the console sends the
// audit trail for a person keeps what tells them apart: a long provider
// name keeps its @NAMESPACE within the 128 characters the trail keeps,
// and characters that show as blanks are written out, not passed as
// nothing.
func TestConsoleActorKeepsTheNamespace(t *testing.T) {
	var got string
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header.Get("Deskway-Actor") }))
	defer api.Close()
	c := &console{cfg: &config.Console{API: api.URL, Token: config.NewSecret("t")}, client: api.Client()}
	for _, tc := range []struct{ user, via, want string }{
		{"root1" + strings.Repeat("x", 70) + "@idp.example", "oidc", "@idp.example"},
		{"root1" + strings.Repeat("\u2800", 60), "ldap", `root1\u2800\u2800`},
		{"ada", "", "admin, web console: ada"},
	} {
		if err := c.call(context.Background(), signIn{User: tc.user, Via: tc.via}, roleAdmin, "GET", "/x", nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, tc.want) || strings.ContainsRune(got, '\u2800') || utf8.RuneCountInString(got) > 128 {
			t.Errorf("Deskway-Actor for %q: %q (%d characters), want one with %q", tc.user, got, utf8.RuneCountInString(got), tc.want)
		}
	}
}
