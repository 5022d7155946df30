package obs_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/obs"
)

// TestOnlyAConsoleTokenNamesAConsoleUser: an admin token that says it
// acts for a console user is recorded as the token, in the audit trail
// and for the handler; a console token's request is recorded with the
// person it names.
func TestOnlyAConsoleTokenNamesAConsoleUser(t *testing.T) {
	api := http.NewServeMux()
	seen := make(chan string, 1)
	api.HandleFunc("POST /api/v1/test/act", func(_ http.ResponseWriter, r *http.Request) { seen <- obs.Actor(r.Context()) })
	a := &obs.Admin{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry(),
		Tokens: []string{"operator-token"}, ConsoleTokens: []string{"console-token"}, API: []*http.ServeMux{api}}
	srv := httptest.NewTLSServer(a.Handler())
	defer srv.Close()
	act := func(token, actor string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+"/api/v1/test/act", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(obs.ActorHeader, actor)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST with %s: %s", token, resp.Status)
		}
		return <-seen
	}
	audit := func() []string {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/api/v1/audit", nil)
		req.Header.Set("Authorization", "Bearer operator-token")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l struct{ Entries []struct{ Actor string } }
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range l.Entries {
			out = append(out, e.Actor)
		}
		return out
	}
	if got := act("operator-token", "admin, web console: root1"); got != "admin token 1" {
		t.Errorf("an admin token naming root1 acts as %q", got)
	}
	if got := act("console-token", "admin, web console: ada"); got != "console token 1 for admin, web console: ada" {
		t.Errorf("the console token naming ada acts as %q", got)
	}
	if got := audit(); len(got) != 2 || strings.Contains(strings.Join(got, "\n"), "root1") || !strings.Contains(strings.Join(got, "\n"), "console token 1 for admin, web console: ada") {
		t.Fatalf("the audit trail reads %q", got)
	}
}
