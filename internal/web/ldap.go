package web

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/go-ldap/ldap/v3"
	"golang.org/x/sync/singleflight"

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
	// checks bounds the rechecks of signed-in users at once, apart from
	// sign-ins: neither can starve the other.
	checks chan struct{}
	// reads shares one recheck of an entry among the requests asking.
	reads singleflight.Group
	// cache keeps what the directory said of signed-in users, read again
	// after directoryRecheck.
	cache recheckCache
}

// errPasswordSent marks an error that came once the user's password had
// reached the directory: the guess may have been checked, so it counts.
var errPasswordSent = errors.New("web: the password reached the directory")

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

// ldapEntry is a directory user who signed in.
type ldapEntry struct {
	// name is the user's name as the directory spells it (or the
	// username attribute's value): the portal's and the broker's key.
	name   string
	dn     string
	pwdSet string // see passwordSet
	groups []string
}

// filterAttribute finds the attributes a user filter compares with the
// typed name: uid in (&(objectClass=person)(uid={user})).
var filterAttribute = regexp.MustCompile(`\(([A-Za-z][A-Za-z0-9;-]*)=\{user\}\)`)

// matchedName is the value of one of the filter's attributes in e that
// is the typed name, up to case, as the directory spells it; "" when
// none is: the directory matched the entry to a name that is not its own.
func (l *ldapLogin) matchedName(e *ldap.Entry, typed string) string {
	for _, m := range filterAttribute.FindAllStringSubmatch(l.cfg.UserFilter, -1) {
		for _, v := range e.GetAttributeValues(m[1]) {
			if strings.EqualFold(v, typed) {
				return v
			}
		}
	}
	return ""
}

// authenticate checks user's password and returns the entry: the name
// to sign in as, its DN and every group the user is in, directly or
// through other groups. onEntry is told the entry found before its
// password is tried; its error ends the sign-in with that error.
// errWrongPassword says the directory refused; an error wrapping
// errPasswordSent, that the password reached the directory but its
// answer did not come back whole; any other error, that it could not be
// asked.
func (l *ldapLogin) authenticate(ctx context.Context, user, password string, onEntry func(dn string) error) (ldapEntry, error) {
	// An empty password is an unauthenticated bind, which directories
	// accept without checking anything.
	if user == "" || password == "" {
		return ldapEntry{}, errWrongPassword
	}
	select {
	case l.slots <- struct{}{}:
		defer func() { <-l.slots }()
	default:
		return ldapEntry{}, errDirectoryBusy
	}
	conn, err := l.dial(ctx)
	if err != nil {
		return ldapEntry{}, err
	}
	defer conn.Close()
	// Each operation has its own timeout; ctx bounds them all.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := l.reader(conn); err != nil {
		return ldapEntry{}, err
	}
	entry, err := l.find(conn, user)
	if err != nil {
		return ldapEntry{}, err
	}
	if err := onEntry(entry.DN); err != nil {
		return ldapEntry{}, err
	}
	if err := conn.Bind(entry.DN, password); err != nil {
		if ldap.IsErrorWithCode(err, ldap.LDAPResultInvalidCredentials) {
			return ldapEntry{}, errWrongPassword
		}
		return ldapEntry{}, fmt.Errorf("%w: binding as %s: %w", errPasswordSent, entry.DN, err)
	}
	// Groups are read as the reader: a user may not be allowed to.
	if err := l.reader(conn); err != nil {
		return ldapEntry{}, fmt.Errorf("%w: %w", errPasswordSent, err)
	}
	groups, err := l.groups(ctx, conn, entry.DN)
	if err != nil {
		return ldapEntry{}, fmt.Errorf("%w: %w", errPasswordSent, err)
	}
	return ldapEntry{name: l.entryName(entry, user), dn: entry.DN, pwdSet: passwordSet(entry), groups: groups}, nil
}

// reader binds conn as web.ldap.bind_dn, when there is one.
func (l *ldapLogin) reader(conn *ldap.Conn) error {
	if l.cfg.BindDN == "" {
		return nil
	}
	if err := conn.Bind(l.cfg.BindDN, l.cfg.BindPassword.Value()); err != nil {
		return fmt.Errorf("the directory refused web.ldap.bind_dn %q: %w", l.cfg.BindDN, err)
	}
	return nil
}

// find searches the one entry user names. errWrongPassword when there is
// none, several, or one the directory matched to a name that is not the
// entry's own (a look-alike spelling): a name must point at one person,
// and only by itself.
func (l *ldapLogin) find(conn *ldap.Conn, user string) (*ldap.Entry, error) {
	attrs := []string{"dn"}
	for _, m := range filterAttribute.FindAllStringSubmatch(l.cfg.UserFilter, -1) {
		attrs = append(attrs, m[1])
	}
	if l.cfg.UsernameAttribute != "" {
		attrs = append(attrs, l.cfg.UsernameAttribute)
	}
	attrs = append(attrs, passwordAttributes...)
	filter := strings.ReplaceAll(l.cfg.UserFilter, "{user}", ldap.EscapeFilter(user))
	res, err := conn.Search(ldap.NewSearchRequest(l.cfg.BaseDN, ldap.ScopeWholeSubtree, ldap.NeverDerefAliases, 2, 10, false,
		filter, attrs, nil))
	if err != nil && !ldap.IsErrorWithCode(err, ldap.LDAPResultSizeLimitExceeded) {
		return nil, fmt.Errorf("the directory: searching %s: %w", filter, err)
	}
	if res == nil || len(res.Entries) != 1 || l.matchedName(res.Entries[0], user) == "" {
		return nil, errWrongPassword
	}
	return res.Entries[0], nil
}

// entryName is the name a signed-in entry goes by, whatever it was found
// by: the username attribute's value; or, when the entry's own name (its
// DN's first part, uid=carol) is one of the filter's attributes, that
// value; or the name it was found by as the directory spells it. So
// "Carol" and "carol", or two values of a multi-valued uid, are one
// portal user.
func (l *ldapLogin) entryName(e *ldap.Entry, typed string) string {
	if a := l.cfg.UsernameAttribute; a != "" && e.GetAttributeValue(a) != "" {
		return e.GetAttributeValue(a)
	}
	if dn, err := ldap.ParseDN(e.DN); err == nil && len(dn.RDNs) > 0 {
		for _, rdn := range dn.RDNs[0].Attributes {
			for _, m := range filterAttribute.FindAllStringSubmatch(l.cfg.UserFilter, -1) {
				if strings.EqualFold(rdn.Type, m[1]) && rdn.Value != "" {
					return rdn.Value
				}
			}
		}
	}
	return l.matchedName(e, typed)
}

// entryKey is the throttle's name for a directory entry: every name
// that finds the entry counts against it.
func entryKey(dn string) string {
	sum := sha256.Sum256([]byte(strings.ToLower(dn)))
	return "ldap-entry-" + hex.EncodeToString(sum[:16])
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
