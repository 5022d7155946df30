package web_test

import (
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// TestLDAPDeletedUserCannotOutrunTheRecheck: a directory user deleted
// from the directory sends 150 launches at once with her old cookie,
// after the recheck cache has passed, to fill the directory's slots: no
// request may go on with her old groups because the directory was busy
// with the others.
func TestLDAPDeletedUserCannotOutrunTheRecheck(t *testing.T) {
	p, dir := ldapPortal(t)
	cookie := p.signIn("lara", "Lara-LDAP-1")
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, cookie, nil)))[1]
	conn := directoryAdmin(t, dir)
	laraDN := "uid=lara,ou=people," + dir.BaseDN
	mod := ldap.NewModifyRequest("cn=ops,ou=groups,"+dir.BaseDN, nil)
	mod.Delete("member", []string{laraDN})
	if err := conn.Modify(mod); err != nil {
		t.Fatal(err)
	}
	if err := conn.Del(ldap.NewDelRequest(laraDN, nil)); err != nil {
		t.Fatal(err)
	}
	const n = 150
	tr := p.srv.Client().Transport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = n
	tr.MaxConnsPerHost = 0
	c := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// Open n keep-alive connections first, so the burst is not spread by handshakes.
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := c.Get(p.srv.URL + "/healthz"); err == nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
		}()
	}
	wg.Wait()
	for round := 0; round < 5; round++ {
		p.clock.add(time.Minute) // the 30 s cache has passed
		start := make(chan struct{})
		codes := make(chan int, n)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("POST", p.srv.URL+"/launch", strings.NewReader(url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("Sec-Fetch-Site", "same-origin")
				req.AddCookie(cookie)
				<-start
				resp, err := c.Do(req)
				if err != nil {
					codes <- 0
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes <- resp.StatusCode
			}()
		}
		close(start)
		wg.Wait()
		close(codes)
		seen := map[int]int{}
		for code := range codes {
			seen[code]++
		}
		t.Logf("round %d: answers to %d launches by deleted lara: %v", round, n, seen)
		if seen[http.StatusOK] > 0 {
			t.Errorf("lara, deleted from the directory, launched desk %d times with her old cookie", seen[http.StatusOK])
			return
		}
	}
}

// cuttable is a TCP relay to a directory that the test can take down,
// or make hang up on each connection (counting them).
type cuttable struct {
	ln      net.Listener
	mu      sync.Mutex
	conns   []net.Conn
	hangUp  atomic.Bool
	refused atomic.Int32
}

func relay(t *testing.T, target string) *cuttable {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cuttable{ln: ln}
	t.Cleanup(c.cut)
	go func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			if c.hangUp.Load() {
				c.refused.Add(1)
				down.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				down.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, down, up)
			c.mu.Unlock()
			go func() { io.Copy(up, down); up.Close() }()
			go func() { io.Copy(down, up); down.Close() }()
		}
	}()
	return c
}

// cut refuses new connections and ends the open ones.
func (c *cuttable) cut() {
	c.ln.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.conns {
		k.Close()
	}
}

// newPortalBehindRelay is a portal whose directory (lara in ops, ops in
// staff) it reaches through a relay the test can cut or make hang up.
func newPortalBehindRelay(t *testing.T) (*portal, *cuttable) {
	t.Helper()
	var link *cuttable
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		dir := testkit.StartSlapd(t, []testkit.LDAPUser{{UID: "lara", Password: "Lara-LDAP-1", Groups: []string{"ops"}}},
			[]testkit.LDAPGroup{{CN: "staff"}, {CN: "ops", Groups: []string{"staff"}}})
		u, err := url.Parse(dir.URL)
		if err != nil {
			t.Fatal(err)
		}
		link = relay(t, u.Host)
		w.LDAP = &config.LDAP{URL: "ldap://" + link.ln.Addr().String(), BindDN: dir.BindDN, BindPassword: config.NewSecret(dir.BindPW), BaseDN: dir.BaseDN}
		return nil
	})
	return p, link
}

// TestLDAPOutageEndsRightsAfterAGrace: while the directory is down, a
// sign-in keeps the groups it last had for a few minutes, then is
// refused (its cookie kept) until the directory answers: a deleted user
// cannot launch for the cookie's lifetime by keeping the directory
// unreachable from the portal.
func TestLDAPOutageEndsRightsAfterAGrace(t *testing.T) {
	p, link := newPortalBehindRelay(t)
	cookie := p.signIn("lara", "Lara-LDAP-1")
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, cookie, nil)))[1]
	launch := func() *http.Response {
		return p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, cookie, nil)
	}
	link.cut()
	p.clock.add(time.Minute)
	if r := launch(); r.StatusCode != http.StatusOK {
		t.Fatalf("a minute into the outage, lara's launch: %s", r.Status)
	}
	p.clock.add(5 * time.Minute)
	r := launch()
	if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/signin" {
		t.Fatalf("six minutes into the outage, lara's launch: %s", r.Status)
	}
	for _, c := range r.Cookies() {
		if c.Name == "__Host-deskway" {
			t.Fatalf("the outage cleared lara's cookie: %v", c)
		}
	}
}

// TestLDAPOutageIsNotAskedEveryRequest: while the directory hangs up,
// a signed-in user's requests are answered from what it last said
// without each dialling it again: 20 launches within a few seconds make
// one attempt.
func TestLDAPOutageIsNotAskedEveryRequest(t *testing.T) {
	p, link := newPortalBehindRelay(t)
	cookie := p.signIn("lara", "Lara-LDAP-1")
	csrf := csrfField.FindStringSubmatch(read(p.do("GET", "/", nil, cookie, nil)))[1]
	link.hangUp.Store(true)
	p.clock.add(time.Minute)
	for i := range 20 {
		if r := p.do("POST", "/launch", url.Values{"delivery_group": {"desk"}, "csrf": {csrf}}, cookie, nil); r.StatusCode != http.StatusOK {
			t.Fatalf("launch %d during the outage: %s", i, r.Status)
		}
		p.clock.add(200 * time.Millisecond)
	}
	if n := link.refused.Load(); n != 1 {
		t.Fatalf("20 launches within 4 s of an outage dialled the directory %d times (want 1)", n)
	}
}
