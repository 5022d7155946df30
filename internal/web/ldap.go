package web

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-ldap/ldap/v3"

	"github.com/deskway/deskway/internal/config"
)

// maxGroupDepth bounds how far nested groups are followed; a cycle in
// the directory ends there too.
const maxGroupDepth = 8

// errWrongPassword is a refused sign-in: no such user, or a wrong
// password, which a person is not told apart.
var errWrongPassword = errors.New("web: wrong user name or password")

// ldapLogin checks passwords against a directory and reads its groups.
type ldapLogin struct {
	cfg *config.LDAP
	tls *tls.Config
	// slots bounds the sign-ins talking to the directory at once: a slow
	// directory must not gather every sign-in's goroutine and connection.
	slots chan struct{}
}

// errDirectoryBusy is a sign-in turned away while every slot waits on
// the directory.
var errDirectoryBusy = errors.New("web: too many sign-ins are waiting for the directory")

// dial connects (and upgrades with StartTLS when asked), bounded by ctx.
func (l *ldapLogin) dial(ctx context.Context) (*ldap.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := ldap.DialURL(l.cfg.URL, ldap.DialWithDialer(d), ldap.DialWithTLSConfig(l.tls))
	if err != nil {
		return nil, fmt.Errorf("the directory %s: %w", l.cfg.URL, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetTimeout(time.Until(dl))
	} else {
		conn.SetTimeout(10 * time.Second)
	}
	if l.cfg.StartTLS {
		if err := conn.StartTLS(l.tls); err != nil {
			conn.Close()
			return nil, fmt.Errorf("the directory %s: StartTLS: %w", l.cfg.URL, err)
		}
	}
	return conn, nil
}

// authenticate checks user's password and returns the name to sign in
// as and every group the user is in, directly or through other groups.
// errWrongPassword says the directory refused; any other error, that it
// could not be asked.
func (l *ldapLogin) authenticate(ctx context.Context, user, password string) (string, []string, error) {
	// An empty password is an unauthenticated bind, which directories
	// accept without checking anything.
	if user == "" || password == "" {
		return "", nil, errWrongPassword
	}
	select {
	case l.slots <- struct{}{}:
		defer func() { <-l.slots }()
	default:
		return "", nil, errDirectoryBusy
	}
	conn, err := l.dial(ctx)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close()
	// Each operation has its own timeout; ctx bounds them all.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	reader := func() error {
		if l.cfg.BindDN == "" {
			return nil
		}
		if err := conn.Bind(l.cfg.BindDN, l.cfg.BindPassword.Value()); err != nil {
			return fmt.Errorf("the directory refused web.ldap.bind_dn %q: %w", l.cfg.BindDN, err)
		}
		return nil
	}
	if err := reader(); err != nil {
		return "", nil, err
	}
	attrs := []string{"dn"}
	if l.cfg.UsernameAttribute != "" {
		attrs = append(attrs, l.cfg.UsernameAttribute)
	}
	filter := strings.ReplaceAll(l.cfg.UserFilter, "{user}", ldap.EscapeFilter(user))
	res, err := conn.Search(ldap.NewSearchRequest(l.cfg.BaseDN, ldap.ScopeWholeSubtree, ldap.NeverDerefAliases, 2, 10, false,
		filter, attrs, nil))
	if err != nil && !ldap.IsErrorWithCode(err, ldap.LDAPResultSizeLimitExceeded) {
		return "", nil, fmt.Errorf("the directory: searching %s: %w", filter, err)
	}
	if res == nil || len(res.Entries) != 1 {
		// None, or several: a name must point at one person.
		return "", nil, errWrongPassword
	}
	entry := res.Entries[0]
	if err := conn.Bind(entry.DN, password); err != nil {
		if ldap.IsErrorWithCode(err, ldap.LDAPResultInvalidCredentials) {
			return "", nil, errWrongPassword
		}
		return "", nil, fmt.Errorf("the directory: binding as %s: %w", entry.DN, err)
	}
	name := user
	if a := l.cfg.UsernameAttribute; a != "" && entry.GetAttributeValue(a) != "" {
		name = entry.GetAttributeValue(a)
	}
	// Groups are read as the reader: a user may not be allowed to.
	if err := reader(); err != nil {
		return "", nil, err
	}
	groups, err := l.groups(ctx, conn, entry.DN)
	if err != nil {
		return "", nil, err
	}
	return name, groups, nil
}

// groups collects the groups holding dn, then the groups holding those,
// breadth first.
func (l *ldapLogin) groups(ctx context.Context, conn *ldap.Conn, dn string) ([]string, error) {
	seen := map[string]bool{}
	var names []string
	frontier := []string{dn}
	for depth := 0; depth < maxGroupDepth && len(frontier) > 0; depth++ {
		var next []string
		for _, member := range frontier {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("the directory: reading groups took too long: %w", err)
			}
			filter := strings.ReplaceAll(l.cfg.GroupFilter, "{dn}", ldap.EscapeFilter(member))
			res, err := conn.Search(ldap.NewSearchRequest(l.cfg.GroupBaseDN, ldap.ScopeWholeSubtree, ldap.NeverDerefAliases, 1000, 10, false,
				filter, []string{l.cfg.GroupNameAttribute}, nil))
			if err != nil {
				return nil, fmt.Errorf("the directory: searching groups %s: %w", filter, err)
			}
			for _, e := range res.Entries {
				key := strings.ToLower(e.DN)
				if seen[key] {
					continue
				}
				seen[key] = true
				if n := e.GetAttributeValue(l.cfg.GroupNameAttribute); n != "" {
					names = append(names, n)
				}
				next = append(next, e.DN)
			}
		}
		frontier = next
	}
	return names, nil
}
