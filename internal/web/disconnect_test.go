package web_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/testkit"
)

// heldDirectory relays to a directory and, once a connection has sent a
// password marked by mark, holds the directory's answers on it until the
// portal closes it or hold passes: the moment a user's bind is at the
// directory and its answer on the way. Each such password is sent on
// passwords, and the end of its connection on ended.
type heldDirectory struct {
	mark []byte
	hold time.Duration
	// drop, instead, cuts the connection when the answer comes: a
	// directory that fails mid-bind.
	drop             bool
	passwords, ended chan struct{}
}

func (d *heldDirectory) start(t *testing.T, target string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go d.relay(c, up)
		}
	}()
	return ln.Addr().String()
}

func (d *heldDirectory) relay(c, up net.Conn) {
	sent, closed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(closed)
		defer up.Close()
		buf := make([]byte, 4096)
		held := false
		for {
			n, err := c.Read(buf)
			if n > 0 && !held && bytes.Contains(buf[:n], d.mark) {
				held = true
				close(sent)
				d.passwords <- struct{}{}
			}
			if n > 0 {
				if _, werr := up.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		c.Close()
		<-closed
		select {
		case <-sent:
			d.ended <- struct{}{}
		default:
		}
	}()
	buf := make([]byte, 4096)
	for {
		n, err := up.Read(buf)
		if n > 0 {
			select {
			case <-sent:
				// The password's answer: late, or never if the portal
				// gives up on it.
				if d.drop {
					return
				}
				select {
				case <-closed:
				case <-time.After(d.hold):
				}
			default:
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestLDAPSignInLeftMidCheckStillCounts: a client that hangs up once its
// wrong password is at the directory, before the answer, still has the
// attempt counted: carol is locked out after five such guesses, the
// sixth is turned away before the directory sees it.
func TestLDAPSignInLeftMidCheckStillCounts(t *testing.T) {
	dir := &heldDirectory{mark: []byte("wrong-"), hold: 300 * time.Millisecond, passwords: make(chan struct{}, 1), ended: make(chan struct{}, 1)}
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		slapd := testkit.StartSlapd(t, []testkit.LDAPUser{{UID: "carol", Password: "Carol-LDAP-1", Groups: []string{"ops"}}},
			[]testkit.LDAPGroup{{CN: "staff"}, {CN: "ops", Groups: []string{"staff"}}})
		u, err := url.Parse(slapd.URL)
		if err != nil {
			t.Fatal(err)
		}
		w.LDAP = &config.LDAP{URL: "ldap://" + dir.start(t, u.Host), BindDN: slapd.BindDN, BindPassword: config.NewSecret(slapd.BindPW), BaseDN: slapd.BaseDN}
		return nil
	})
	host := strings.TrimPrefix(p.srv.URL, "https://")
	const tries = 10
	reached := 0
	for i := range tries {
		form := url.Values{"user": {"carol"}, "password": {fmt.Sprintf("wrong-%03d", i)}}.Encode()
		c, err := tls.Dial("tcp", host, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /signin HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nSec-Fetch-Site: same-origin\r\nContent-Length: %d\r\n\r\n%s", host, len(form), form)
		answer := make(chan int, 1)
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answer <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			answer <- resp.StatusCode
		}()
		select {
		case <-dir.passwords:
			reached++
			c.Close()
			// The portal is done with the guess when it leaves the
			// directory.
			select {
			case <-dir.ended:
			case <-time.After(20 * time.Second):
				t.Fatalf("guess %d: the portal kept its directory connection", i)
			}
			continue
		case code := <-answer:
			c.Close()
			if code != http.StatusTooManyRequests {
				t.Fatalf("guess %d, answered before its password reached the directory: %d", i, code)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("guess %d: no answer and no password at the directory", i)
		}
		break
	}
	t.Logf("%d guesses whose clients hung up reached the directory", reached)
	if reached > 5 {
		t.Fatalf("%d wrong passwords for carol reached the directory from clients that hung up (at most 5 may)", reached)
	}
	r := p.do("POST", "/signin", url.Values{"user": {"carol"}, "password": {"Carol-LDAP-1"}}, nil, nil)
	if r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("carol's right password after five counted guesses: %s", r.Status)
	}
}

// TestLDAPSignInCutMidBindStillCounts: a directory connection that fails
// once the password is at the directory leaves the guess counted, though
// the portal says the directory did not answer: five such guesses lock
// carol out.
func TestLDAPSignInCutMidBindStillCounts(t *testing.T) {
	dir := &heldDirectory{mark: []byte("wrong-"), drop: true, passwords: make(chan struct{}, 16), ended: make(chan struct{}, 16)}
	p := newPortalWith(t, func(_ string, w *config.Web) *http.Client {
		slapd := testkit.StartSlapd(t, []testkit.LDAPUser{{UID: "carol", Password: "Carol-LDAP-1", Groups: []string{"ops"}}},
			[]testkit.LDAPGroup{{CN: "ops"}})
		u, err := url.Parse(slapd.URL)
		if err != nil {
			t.Fatal(err)
		}
		w.LDAP = &config.LDAP{URL: "ldap://" + dir.start(t, u.Host), BindDN: slapd.BindDN, BindPassword: config.NewSecret(slapd.BindPW), BaseDN: slapd.BaseDN}
		return nil
	})
	seen := map[int]int{}
	for i := range 10 {
		r := p.do("POST", "/signin", url.Values{"user": {"carol"}, "password": {fmt.Sprintf("wrong-%03d", i)}}, nil, nil)
		seen[r.StatusCode]++
	}
	if seen[http.StatusServiceUnavailable] != 5 || seen[http.StatusTooManyRequests] != 5 {
		t.Fatalf("10 guesses for carol, each cut once at the directory: answers %v (want five 503, then 429)", seen)
	}
}
