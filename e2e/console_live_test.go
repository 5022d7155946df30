package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/testkit"
)

const consoleLiveConfig = `state_dir: %[1]s
log: {level: info, format: text}
admin: {listen: "127.0.0.1:%[7]d", tokens: [tok]}
tls: {cert: %[2]s, key: %[3]s}
auth:
  token_key: "%[4]s"
  users:
  - {name: ada, password: "Ada-Admin-1", groups: [admins]}
broker:
  listen: "127.0.0.1:%[5]d"
  gateway: "127.0.0.1:3391"
  frontend_tokens: [e2e-portal-token]
  delivery_groups:
  - {name: desk, groups: [staff]}
web:
  listen: "127.0.0.1:%[6]d"
  console: {admins: [admins]}
`

// TestConsoleLivePressSpansRefresh: an admin on the hosts page presses
// Drain with the mouse, and before they let go the page's live refresh
// brings a change to the host's row (its CPU, which its agent reports
// twice a second). The host is drained all the same: the refresh left
// the pressed button in place. It replaced the whole list before, and a
// press that spanned a refresh was lost (a person's click, and a clean-
// clone run's TestXRDPBeside/ConsoleInBrowser). No RDP is involved.
func TestConsoleLivePressSpansRefresh(t *testing.T) {
	parallel(t)
	ctx := newBrowser(t)
	bin := build(t)
	dir := t.TempDir()
	_, _, cert, key := testkit.TLS(t)
	ports := testkit.FreePorts(t, 3)
	const tokenKey = "e2e-token-key-0123456789abcdef0123456789"
	cfg := filepath.Join(dir, "deskway.yaml")
	writeFile(t, cfg, fmt.Sprintf(consoleLiveConfig, filepath.Join(dir, "state"), cert, key, tokenKey, ports[0], ports[1], ports[2]))
	srv := testkit.Start(t, nil, bin, "run", "-c", cfg)
	portal := fmt.Sprintf("https://127.0.0.1:%d", ports[1])
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", ports[1]), 20*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, lastLines(srv.Log.String(), 20))
	}

	// A host whose agent reports a CPU that changes with every heartbeat.
	tokens, err := auth.NewTokens([]byte(tokenKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	join, err := tokens.MintJoin("desk", "", time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	bc := &brokerclient.Client{Base: fmt.Sprintf("https://127.0.0.1:%d", ports[0]),
		HTTP: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
	reg, err := bc.Register(context.Background(), join, brokerapi.RegisterRequest{Name: "h1", Address: "127.0.0.1", Port: 3389})
	if err != nil {
		t.Fatal(err)
	}
	beat, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { stop(); <-done })
	go func() {
		defer close(done)
		for i := 0; beat.Err() == nil; i++ {
			hb := brokerapi.Heartbeat{Host: "h1", CPU: float64(10+i%80) / 100, Memory: 0.3, DiskIdle: 0.9, Sessions: []brokerapi.Session{}}
			if _, err := bc.Heartbeat(beat, reg.Credential, hb); err != nil && beat.Err() == nil {
				t.Logf("heartbeat: %v", err)
			}
			select {
			case <-beat.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()

	must := stepsOf(t, ctx, srv)
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return v
	}
	const drain = "form[action='/admin/hosts/h1/drain'] button"
	must(chromedp.Navigate(portal+"/signin"), chromedp.WaitVisible(chromedp.ID("user")),
		chromedp.SendKeys(chromedp.ID("user"), "ada"), chromedp.SendKeys(chromedp.ID("password"), "Ada-Admin-1"),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")), chromedp.WaitVisible(chromedp.CSS("header nav")),
		chromedp.Navigate(portal+"/admin/hosts"), chromedp.WaitVisible(chromedp.CSS(drain)))
	artifacts := filepath.Join("artifacts", t.Name())
	shot(t, ctx, artifacts, "1-hosts")

	// Press Drain where it shows, as a mouse does.
	box := eval(`(() => { const r = document.querySelector("` + drain + `").getBoundingClientRect();
		window.pressedButton = document.querySelector("` + drain + `");
		window.rowBefore = document.querySelector("tr[data-host='h1']").textContent;
		return (r.left + r.width / 2) + " " + (r.top + r.height / 2); })()`)
	var x, y float64
	if _, err := fmt.Sscan(box, &x, &y); err != nil {
		t.Fatalf("the Drain button's place %q: %v", box, err)
	}
	must(chromedp.MouseEvent(chromedp.MouseMoved, x, y), chromedp.MouseEvent(chromedp.MousePressed, x, y, chromedp.ButtonLeft, chromedp.ClickCount(1)))
	// Held down for 7 s: two refreshes are due, and the agent reported
	// a new CPU for the row meanwhile.
	time.Sleep(7 * time.Second)
	held := eval(`String(window.pressedButton.isConnected)`)
	must(chromedp.MouseEvent(chromedp.MouseReleased, x, y, chromedp.ButtonLeft, chromedp.ClickCount(1)))
	if held != "true" {
		t.Errorf("the Drain button being pressed left the page during the press (a refresh replaced it)")
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, chromedp.WaitVisible(chromedp.CSS("form[action='/admin/hosts/h1/undrain'] button"))); err != nil {
		shot(t, ctx, artifacts, "2-after-release")
		t.Fatalf("pressing Drain across the page's refresh did not drain the host: %v", err)
	}
	if n := eval(`document.querySelector(".notice").textContent`); !strings.Contains(n, "Host drained.") {
		t.Fatalf("after Drain the page says %q", n)
	}
	shot(t, ctx, artifacts, "2-drained")

	// Released, the rows follow the host again: a refresh brings the
	// CPU the agent reports now, in the same elements.
	before := eval(`window.keptRow = document.querySelector("tr[data-host='h1']"); window.keptRow.textContent`)
	deadline := time.Now().Add(15 * time.Second)
	for eval(`document.querySelector("tr[data-host='h1']").textContent`) == before {
		if time.Now().After(deadline) {
			t.Fatalf("the hosts page did not follow the host's reports for 15 s: row %q", before)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if eval(`String(window.keptRow.isConnected)`) != "true" {
		t.Errorf("a refresh that changed the host's CPU replaced its row")
	}
}

// stepsOf runs browser steps in ctx, each batch within 20 s: an element
// the page lacks fails the test, with the last lines srv logged, instead
// of waiting for it without end.
func stepsOf(t *testing.T, ctx context.Context, srv *testkit.Process) func(steps ...chromedp.Action[chromedp.Void]) {
	return func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := chromedp.Do(sctx, steps...); err != nil {
			t.Fatalf("%v\n%s", err, lastLines(srv.Log.String(), 20))
		}
	}
}
