package web_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/config"
)

// TestConsoleHostsShowCPUPressure: the console's hosts page shows the CPU
// pressure h1's agent reported, read through the broker's admin API, and
// the reason the host is unhealthy once it is over the threshold.
func TestConsoleHostsShowCPUPressure(t *testing.T) {
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		w.Console = &config.Console{Admins: []string{"staff"}, Token: config.NewSecret("console-admin-token")}
		return nil
	})
	cookie := p.signIn("alice", "Alice-Pass-1")
	row := regexp.MustCompile(`(?s)<tr data-host="h1">.*?</tr>`)
	cell := regexp.MustCompile(`<td class="cpu-pressure">([^<]*)</td>`)
	status := regexp.MustCompile(`<td class="status">([^<]*)</td>`)
	hostRow := func(cpuPressure float64) (pressure, st string) {
		t.Helper()
		if _, err := p.agent.Heartbeat(context.Background(), p.hostCred,
			brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9, CPU: 0.95, CPUPressure: cpuPressure, Sessions: []brokerapi.Session{}}); err != nil {
			t.Fatal(err)
		}
		resp := p.do("GET", "/admin/hosts", nil, cookie, nil)
		body := read(resp)
		r := row.FindString(body)
		if resp.StatusCode != http.StatusOK || r == "" {
			t.Fatalf("hosts page: %s\n%s", resp.Status, body)
		}
		c, s := cell.FindStringSubmatch(r), status.FindStringSubmatch(r)
		if c == nil || s == nil {
			t.Fatalf("h1's row has no CPU pressure or status cell:\n%s", r)
		}
		return c[1], s[1]
	}
	if pressure, st := hostRow(0.42); pressure != "42%" || st != "ok" {
		t.Fatalf("h1 at 42%% CPU pressure shows %q, status %q", pressure, st)
	}
	if pressure, st := hostRow(0.9); pressure != "90%" || st != "unhealthy (cpu pressure 90% &gt; 80%)" {
		t.Fatalf("h1 at 90%% CPU pressure shows %q, status %q", pressure, st)
	}
}

// TestConsoleRefusalKeepsThePage: a refused action answers with the page
// it returns to, its rows listed under the refusal; before, the answer
// was the page's frame alone, which read as an empty list ("No host
// yet") under the refusal.
func TestConsoleRefusalKeepsThePage(t *testing.T) {
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		w.Console = &config.Console{Admins: []string{"staff"}, Token: config.NewSecret("console-admin-token")}
		return nil
	})
	cookie := p.signIn("alice", "Alice-Pass-1")
	if _, err := p.agent.Heartbeat(context.Background(), p.hostCred,
		brokerapi.Heartbeat{Host: "h1", DiskIdle: 0.9, CPU: 0.5, Sessions: []brokerapi.Session{}}); err != nil {
		t.Fatal(err)
	}
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/admin/hosts", nil, cookie, nil)))[1]
	resp := p.do("POST", "/admin/hosts/no-such-host/drain", url.Values{"csrf": {csrf}}, cookie, nil)
	body := read(resp)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "Not done") {
		t.Fatalf("a drain of a host the broker does not know: %s, want 502 with the refusal\n%s", resp.Status, body)
	}
	if !strings.Contains(body, `<tr data-host="h1">`) {
		t.Fatalf("the refusal's page does not list h1, which the broker knows:\n%s", body)
	}
}
