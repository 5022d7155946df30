package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deskway/deskway/internal/testkit"
)

// TestPortalProvidersInBrowser signs in to a running deskway's portal
// through an OpenID provider in chromium: the provider's login page, a
// wrong password there, the right one, back at the portal with the
// desktops the provider's groups entitle; then a user in no group, told
// what to do. Then through a real slapd directory, whose nested group
// entitles its user.
func TestPortalProvidersInBrowser(t *testing.T) {
	// Deskway, the identity provider and slapd on ports the kernel
	// chose; no RDP.
	parallel(t)
	ctx := newBrowser(t)
	bin := build(t)
	dir := t.TempDir()
	adminPort, gwPort, brokerPort, webPort := testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
	public := fmt.Sprintf("https://127.0.0.1:%d", webPort)
	op := testkit.StartOIDC(t, "deskway-portal", "portal-secret", []string{public + "/oidc/callback"}, []testkit.OIDCUser{
		{Username: "olga", Password: "Olga-OIDC-1", Groups: []string{"staff"}},
		{Username: "nora", Password: "Nora-OIDC-1"},
	})
	dirsrv := testkit.StartSlapd(t, []testkit.LDAPUser{{UID: "lara", Password: "Lara-LDAP-1", Groups: []string{"ops"}}},
		[]testkit.LDAPGroup{{CN: "staff"}, {CN: "ops", Groups: []string{"staff"}}})
	web := fmt.Sprintf(`web:
  listen: "127.0.0.1:%d"
  public_url: %s
  oidc:
    issuer: %s
    client_id: deskway-portal
    client_secret: portal-secret
    ca: %s
    label: Sign in with Example IdP
  ldap:
    url: %s
    bind_dn: %s
    bind_password: %s
    base_dn: %s
`, webPort, public, op.Issuer, op.CAFile, dirsrv.URL, dirsrv.BindDN, dirsrv.BindPW, dirsrv.BaseDN)
	body := fmt.Sprintf(reloadConfig, filepath.Join(dir, "state"), adminPort, gwPort, brokerPort, "")
	body = strings.Replace(body, "broker:\n", "broker:\n  frontend_tokens: [e2e-portal-token]\n", 1) + web
	cfg := filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testkit.Start(t, nil, bin, "run", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", webPort), 20*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, p.Log.String())
	}
	art := filepath.Join("artifacts", t.Name())
	read := func(a chromedp.Action[string]) string {
		t.Helper()
		v, err := chromedp.Run(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	signIn := func(user, password string) {
		t.Helper()
		if err := chromedp.Do(ctx,
			chromedp.Navigate(public+"/signin"),
			chromedp.WaitVisible(chromedp.CSS("a.button")),
			chromedp.Click(chromedp.CSS("a.button")),
			chromedp.WaitVisible(chromedp.ID("username")),
			chromedp.SendKeys(chromedp.ID("username"), user),
			chromedp.SendKeys(chromedp.ID("password"), password),
			chromedp.Click(chromedp.CSS("button[type=submit]")),
			chromedp.WaitReady(chromedp.CSS("body")),
		); err != nil {
			t.Fatalf("signing in as %s at the provider: %v\n%s", user, err, lastLines(p.Log.String(), 20))
		}
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(public+"/signin"), chromedp.WaitVisible(chromedp.CSS("a.button"))); err != nil {
		t.Fatal(err)
	}
	if b := read(chromedp.Text(chromedp.CSS("a.button"))); b != "Sign in with Example IdP" {
		t.Fatalf("the provider's button reads %q", b)
	}
	shot(t, ctx, art, "1-signin-with-provider")
	signIn("olga", "not-her-password")
	// The provider answers the wrong password with its login page again,
	// saying so: wait for that page, not for the one being left (a
	// screenshot taken mid-navigation can hang until the deadline).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		done, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.readyState === 'complete' && document.body.innerText.toLowerCase().includes('wrong')`))
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refusal from the provider after a wrong password:\n%s", lastLines(p.Log.String(), 20))
		}
	}
	if u := read(chromedp.Location()); !strings.HasPrefix(u, op.Issuer) {
		t.Fatalf("a wrong password at the provider went on to %s", u)
	}
	shot(t, ctx, art, "2-provider-wrong-password")
	signIn("olga", "Olga-OIDC-1")
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("li.desktop[data-group='desk']"))); err != nil {
		t.Fatalf("olga (staff) sees no desk: %v", err)
	}
	if who := read(chromedp.Text(chromedp.CSS(".who"))); !strings.Contains(who, "olga") {
		t.Fatalf("signed in as %q", who)
	}
	shot(t, ctx, art, "3-desktops-after-provider")
	// On a phone's width the page fits without scrolling sideways.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("li.desktop[data-group='desk']"))); err != nil {
		t.Fatal(err)
	}
	if over, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth - window.innerWidth`)); err != nil || over > 0 {
		t.Fatalf("at 390 px the page is %d px too wide (%v)", over, err)
	}
	shot(t, ctx, art, "3b-desktops-on-a-phone")
	if err := chromedp.Do(ctx, chromedp.EmulateReset()); err != nil {
		t.Fatal(err)
	}
	// Sign-out goes on to the provider's logout, which ends the chain.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("form.signout button"))); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		u := read(chromedp.Location())
		if strings.HasPrefix(u, op.Issuer+"/logged-out") || u == public+"/signin" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sign-out ended at %s, not at the provider's logout", u)
		}
	}
	signIn("nora", "Nora-OIDC-1")
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("p.empty"))); err != nil {
		t.Fatalf("nora (no group) is not told she has no desktop: %v", err)
	}
	shot(t, ctx, art, "4-user-in-no-group")
	if !strings.Contains(p.Log.String(), `"msg":"portal sign-in","role":"web","user":"olga@127.0.0.1","via":"oidc"`) {
		t.Fatalf("the portal did not log olga's provider sign-in:\n%s", lastLines(p.Log.String(), 20))
	}
	// The directory: lara's staff comes through ops.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("form.signout button"))); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if u := read(chromedp.Location()); strings.HasPrefix(u, op.Issuer+"/logged-out") || u == public+"/signin" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second sign-out did not end")
		}
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(public+"/signin"),
		chromedp.WaitVisible(chromedp.ID("user")),
		chromedp.SendKeys(chromedp.ID("user"), "lara"),
		chromedp.SendKeys(chromedp.ID("password"), "Lara-LDAP-1"),
		chromedp.Click(chromedp.CSS("form[action='/signin'] button")),
		chromedp.WaitVisible(chromedp.CSS("li.desktop[data-group='desk']")),
	); err != nil {
		t.Fatalf("lara's directory sign-in: %v\n%s", err, lastLines(p.Log.String(), 20))
	}
	shot(t, ctx, art, "5-directory-user-nested-group")
}
