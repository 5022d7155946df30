package web_test

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// ldapPortal signs people in against a real slapd: lara is in ops,
// which is in staff (entitled to desk); nina is in no group; alice is a
// local user and a directory user both, with different passwords.
func ldapPortal(t *testing.T) (*portal, *testkit.LDAP) {
	var dir *testkit.LDAP
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		dir = testkit.StartSlapd(t, []testkit.LDAPUser{
			{UID: "lara", Password: "Lara-LDAP-1", Groups: []string{"ops"}},
			{UID: "nina", Password: "Nina-LDAP-1"},
			{UID: "alice", Password: "Alice-LDAP-1", Groups: []string{"ops"}},
		}, []testkit.LDAPGroup{{CN: "staff"}, {CN: "ops", Groups: []string{"staff"}}})
		w.LDAP = &config.LDAP{URL: dir.URL, BindDN: dir.BindDN, BindPassword: config.NewSecret(dir.BindPW), BaseDN: dir.BaseDN}
		return nil
	})
	return p, dir
}

func TestLDAPSignInWithNestedGroups(t *testing.T) {
	p, _ := ldapPortal(t)
	// lara's groups: ops directly, staff through ops; staff launches desk.
	body := read(p.do("GET", "/", nil, p.signIn("lara", "Lara-LDAP-1"), nil))
	if !strings.Contains(body, "Signed in as <strong>lara</strong>") || !strings.Contains(body, "<h2>desk</h2>") {
		t.Fatalf("lara's page:\n%s", body)
	}
	for _, bad := range []struct{ user, pw string }{
		{"lara", "wrong"},
		{"lara", ""},              // an unauthenticated bind checks nothing
		{"nobody", "Lara-LDAP-1"}, // no such user
		{"*", "Lara-LDAP-1"},      // a filter, not a name
		{"lara)(uid=*", "Lara-LDAP-1"},
	} {
		r := p.do("POST", "/signin", url.Values{"user": {bad.user}, "password": {bad.pw}}, nil, nil)
		if b := read(r); r.StatusCode != http.StatusUnauthorized || !strings.Contains(b, "Wrong user name or password") {
			t.Errorf("sign-in as %q with %q: %s", bad.user, bad.pw, r.Status)
		}
	}
	// A user in no group signs in and is told what to do.
	if body := read(p.do("GET", "/", nil, p.signIn("nina", "Nina-LDAP-1"), nil)); !strings.Contains(body, "You may launch no desktop") {
		t.Fatalf("nina's page:\n%s", body)
	}
	// Spaces a directory ignores do not make a second name.
	for _, typed := range []string{"lara ", " lara"} {
		if r := p.do("POST", "/signin", url.Values{"user": {typed}, "password": {"Lara-LDAP-1"}}, nil, nil); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("sign-in as %q: %s", typed, r.Status)
		}
	}
	// A local user is the local account: the directory's password for the
	// same name does not sign in.
	if r := p.do("POST", "/signin", url.Values{"user": {"alice"}, "password": {"Alice-LDAP-1"}}, nil, nil); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the directory's password signed in local user alice: %s", r.Status)
	}
}

func TestLDAPDownSaysSo(t *testing.T) {
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		w.LDAP = &config.LDAP{URL: "ldap://127.0.0.1:1", BaseDN: "dc=example,dc=test"}
		return nil
	})
	r := p.do("POST", "/signin", url.Values{"user": {"lara"}, "password": {"Lara-LDAP-1"}}, nil, nil)
	if b := read(r); r.StatusCode != http.StatusServiceUnavailable || !strings.Contains(b, "The directory does not answer") {
		t.Fatalf("sign-in with the directory down: %s\n%s", r.Status, b)
	}
}

// TestLDAPNameThatResolvesToALocalAccount: with username_attribute, a
// directory entry whose attribute holds a local account's name does not
// sign in as that account.
func TestLDAPNameThatResolvesToALocalAccount(t *testing.T) {
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		dir := testkit.StartSlapd(t, []testkit.LDAPUser{
			{UID: "mallory", Password: "Mallory-LDAP-1", CN: "Alice", Groups: []string{"ops"}},
			{UID: "lara", Password: "Lara-LDAP-1", CN: "lara.m"},
		}, []testkit.LDAPGroup{{CN: "ops"}})
		w.LDAP = &config.LDAP{URL: dir.URL, BindDN: dir.BindDN, BindPassword: config.NewSecret(dir.BindPW), BaseDN: dir.BaseDN,
			UsernameAttribute: "cn"}
		return nil
	})
	r := p.do("POST", "/signin", url.Values{"user": {"mallory"}, "password": {"Mallory-LDAP-1"}}, nil, nil)
	if b := read(r); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a directory entry named Alice signed in: %s\n%s", r.Status, b)
	}
	// The attribute names the sign-in otherwise.
	body := read(p.do("GET", "/", nil, p.signIn("lara", "Lara-LDAP-1"), nil))
	if !strings.Contains(body, "Signed in as <strong>lara.m</strong>") {
		t.Fatalf("lara's page:\n%s", body)
	}
}

// carolPortal is a portal whose directory holds carol, in ops (staff).
func carolPortal(t *testing.T) (*portal, *testkit.LDAP) {
	var dir *testkit.LDAP
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		dir = testkit.StartSlapd(t, []testkit.LDAPUser{{UID: "carol", Password: "Carol-LDAP-1", Groups: []string{"ops"}}},
			[]testkit.LDAPGroup{{CN: "staff"}, {CN: "ops", Groups: []string{"staff"}}})
		w.LDAP = &config.LDAP{URL: dir.URL, BindDN: dir.BindDN, BindPassword: config.NewSecret(dir.BindPW), BaseDN: dir.BaseDN}
		return nil
	})
	return p, dir
}

// directoryAdmin is a connection to dir as its root, which may change it.
func directoryAdmin(t *testing.T, dir *testkit.LDAP) *ldap.Conn {
	conn, err := ldap.DialURL(dir.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.Bind(dir.AdminDN, dir.AdminPW); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestLDAPEveryNameOfAnEntryIsOne: an entry with a second uid value
// (c.smith) signs in as carol by either name, and carol's lockout holds
// for c.smith.
func TestLDAPEveryNameOfAnEntryIsOne(t *testing.T) {
	p, dir := carolPortal(t)
	mod := ldap.NewModifyRequest("uid=carol,ou=people,"+dir.BaseDN, nil)
	mod.Add("uid", []string{"c.smith"})
	if err := directoryAdmin(t, dir).Modify(mod); err != nil {
		t.Fatal(err)
	}
	if body := read(p.do("GET", "/", nil, p.signIn("c.smith", "Carol-LDAP-1"), nil)); !strings.Contains(body, "Signed in as <strong>carol</strong>") {
		t.Fatalf("c.smith's page:\n%s", body)
	}
	for range 5 {
		p.do("POST", "/signin", url.Values{"user": {"carol"}, "password": {"wrong"}}, nil, nil)
	}
	r := p.do("POST", "/signin", url.Values{"user": {"c.smith"}, "password": {"Carol-LDAP-1"}}, nil, nil)
	if b := read(r); r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("with carol locked out, sign-in as c.smith: %s\n%s", r.Status, b)
	}
}

// TestLDAPConcurrentSignInsCountBeforeTheDirectory: 30 sign-ins for one
// directory user at once, 29 wrong and the right one, get no more than
// the throttle's five wrong ones past it to the directory (five more
// when the right one, which clears the count, came first); the rest are
// turned away as throttled without being checked.
func TestLDAPConcurrentSignInsCountBeforeTheDirectory(t *testing.T) {
	p, _ := carolPortal(t)
	const n = 30
	codes := make(chan int, n)
	start := make(chan struct{})
	c := &http.Client{Transport: p.srv.Client().Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	var wg sync.WaitGroup
	for i := range n {
		pw := "wrong-" + strconv.Itoa(i)
		if i == n/2 {
			pw = "Carol-LDAP-1"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", p.srv.URL+"/signin", strings.NewReader(url.Values{"user": {"carol"}, "password": {pw}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			<-start
			resp, err := c.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	close(start)
	wg.Wait()
	close(codes)
	seen := map[int]int{}
	for c := range codes {
		seen[c]++
	}
	// A success clears carol's count at this address, so wrong guesses
	// arriving after it start a new window: at most five before and five
	// after, with the right one.
	checked := seen[http.StatusUnauthorized] + seen[http.StatusSeeOther]
	if seen[http.StatusUnauthorized] > 5*(1+seen[http.StatusSeeOther]) || seen[http.StatusTooManyRequests] != n-checked {
		t.Fatalf("of %d concurrent sign-ins as carol %d were checked by the directory (at most 5 wrong ones may be, 10 with a success among them): answers %v", n, checked, seen)
	}
}

// TestLDAPLookAlikeNamesShareTheLockout: with carol locked out, names
// the directory matches to carol (fullwidth, mixed, mathematical bold)
// are locked out too; unlocked, they are refused rather than made second
// portal users, and "Carol" signs in as the directory's carol.
func TestLDAPLookAlikeNamesShareTheLockout(t *testing.T) {
	p, _ := carolPortal(t)
	variants := []string{"ｃａｒｏｌ", "cａrol", "𝐜𝐚𝐫𝐨𝐥"}
	// Unlocked: each variant with the right password is refused.
	for _, v := range variants {
		r := p.do("POST", "/signin", url.Values{"user": {v}, "password": {"Carol-LDAP-1"}}, nil, nil)
		if b := read(r); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("sign-in as %q with carol's password: %s\n%s", v, r.Status, b)
		}
	}
	body := read(p.do("GET", "/", nil, p.signIn("Carol", "Carol-LDAP-1"), nil))
	if !strings.Contains(body, "Signed in as <strong>carol</strong>") {
		t.Fatalf("Carol's page:\n%s", body)
	}
	// On a fresh portal, five wrong passwords lock carol out, and every
	// spelling of her name with her.
	p2, _ := carolPortal(t)
	for range 5 {
		p2.do("POST", "/signin", url.Values{"user": {"carol"}, "password": {"wrong"}}, nil, nil)
	}
	for _, v := range append(variants, "carol", "CAROL") {
		r := p2.do("POST", "/signin", url.Values{"user": {v}, "password": {"Carol-LDAP-1"}}, nil, nil)
		if b := read(r); r.StatusCode != http.StatusTooManyRequests {
			t.Errorf("with carol locked out, sign-in as %q: %s\n%s", v, r.Status, b)
		}
	}
}

// TestLDAPChangesReachLiveSignIns: a directory user removed from the
// group that entitles her can no longer launch with the cookie she got
// before, once the portal's short cache has passed; one whose password
// changed, or whose entry is deleted, is signed out.
func TestLDAPChangesReachLiveSignIns(t *testing.T) {
	p, dir := ldapPortal(t)
	cookie := p.signIn("lara", "Lara-LDAP-1")
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, cookie, nil)))[1]
	launch := func() *http.Response {
		return p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, cookie, nil)
	}
	if r := launch(); r.StatusCode != http.StatusOK {
		t.Fatalf("lara's launch: %s", r.Status)
	}
	conn := directoryAdmin(t, dir)
	laraDN := "uid=lara,ou=people," + dir.BaseDN
	mod := ldap.NewModifyRequest("cn=ops,ou=groups,"+dir.BaseDN, nil)
	mod.Delete("member", []string{laraDN})
	if err := conn.Modify(mod); err != nil {
		t.Fatal(err)
	}
	p.clock.add(time.Minute)
	if r := launch(); r.StatusCode == http.StatusOK {
		t.Fatalf("lara, out of ops, launched desk with her old cookie: %s", r.Status)
	}
	if body := read(p.do("GET", "/", nil, cookie, nil)); strings.Contains(body, "<h2>desk</h2>") {
		t.Fatalf("lara, out of ops, still sees desk:\n%s", body)
	}
	// A new password (the directory's password policy notes when it was
	// set) ends the old sign-in.
	nina := p.signIn("nina", "Nina-LDAP-1")
	if _, err := conn.PasswordModify(ldap.NewPasswordModifyRequest("uid=nina,ou=people,"+dir.BaseDN, "", "Nina-LDAP-2")); err != nil {
		t.Fatal(err)
	}
	p.clock.add(time.Minute)
	if r := p.do("GET", "/", nil, nina, nil); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/signin" {
		t.Fatalf("nina, with a new password, still signed in with the old cookie: %s", r.Status)
	}
	if body := read(p.do("GET", "/", nil, p.signIn("nina", "Nina-LDAP-2"), nil)); !strings.Contains(body, "Signed in as <strong>nina</strong>") {
		t.Fatalf("nina's page after signing in with her new password:\n%s", body)
	}
	if err := conn.Del(ldap.NewDelRequest(laraDN, nil)); err != nil {
		t.Fatal(err)
	}
	p.clock.add(time.Minute)
	if r := p.do("GET", "/", nil, cookie, nil); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/signin" {
		t.Fatalf("lara, deleted from the directory, still signed in: %s", r.Status)
	}
}
