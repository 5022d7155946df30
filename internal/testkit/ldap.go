package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// LDAP is a running slapd with a directory the test seeded.
type LDAP struct {
	URL            string
	BaseDN         string
	BindDN, BindPW string // a reader allowed to search
	// AdminDN and AdminPW are the directory's root, which may change it.
	AdminDN, AdminPW string
}

// LDAPUser is an inetOrgPerson under ou=people; Groups are the cn of the
// groupOfNames it is a direct member of.
type LDAPUser struct {
	UID, Password string
	Groups        []string
	// CN is the entry's common name (default: the uid).
	CN string
}

// LDAPGroup is a groupOfNames under ou=groups; Groups are the groups it
// is itself a member of (nesting).
type LDAPGroup struct {
	CN     string
	Groups []string
}

// StartSlapd runs Debian's slapd on a loopback port with an mdb database
// holding users and groups; it stops at test end.
func StartSlapd(t testing.TB, users []LDAPUser, groups []LDAPGroup) *LDAP {
	t.Helper()
	Require(t, "slapd", "slapadd")
	dir := t.TempDir()
	db := filepath.Join(dir, "db")
	if err := os.MkdirAll(db, 0o700); err != nil {
		t.Fatal(err)
	}
	l := &LDAP{BaseDN: "dc=example,dc=test", BindDN: "cn=reader,dc=example,dc=test", BindPW: "Reader-Pass-1",
		AdminDN: "cn=admin,dc=example,dc=test", AdminPW: "Admin-Pass-1"}
	conf := fmt.Sprintf(`include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
moduleload ppolicy
pidfile %[1]s/slapd.pid
database mdb
suffix "%[2]s"
rootdn "%[5]s"
rootpw %[6]s
directory %[3]s
maxsize 10485760
overlay ppolicy
access to attrs=userPassword
  by self read
  by anonymous auth
  by * none
access to *
  by dn.exact="%[4]s" read
  by self read
  by * none
`, dir, l.BaseDN, db, l.BindDN, l.AdminDN, l.AdminPW)
	confFile := filepath.Join(dir, "slapd.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "dn: %s\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: Example\n\n", l.BaseDN)
	fmt.Fprintf(&b, "dn: %s\nobjectClass: inetOrgPerson\ncn: reader\nsn: reader\nuserPassword: %s\n\n", l.BindDN, l.BindPW)
	fmt.Fprintf(&b, "dn: ou=people,%s\nobjectClass: organizationalUnit\nou: people\n\n", l.BaseDN)
	fmt.Fprintf(&b, "dn: ou=groups,%s\nobjectClass: organizationalUnit\nou: groups\n\n", l.BaseDN)
	members := map[string][]string{}
	for _, u := range users {
		cn := u.CN
		if cn == "" {
			cn = u.UID
		}
		fmt.Fprintf(&b, "dn: uid=%s,ou=people,%s\nobjectClass: inetOrgPerson\nuid: %s\ncn: %s\nsn: %s\nuserPassword: %s\n\n",
			u.UID, l.BaseDN, u.UID, cn, u.UID, u.Password)
		for _, g := range u.Groups {
			members[g] = append(members[g], fmt.Sprintf("uid=%s,ou=people,%s", u.UID, l.BaseDN))
		}
	}
	for _, g := range groups {
		for _, parent := range g.Groups {
			members[parent] = append(members[parent], fmt.Sprintf("cn=%s,ou=groups,%s", g.CN, l.BaseDN))
		}
	}
	for _, g := range groups {
		fmt.Fprintf(&b, "dn: cn=%s,ou=groups,%s\nobjectClass: groupOfNames\ncn: %s\n", g.CN, l.BaseDN, g.CN)
		m := members[g.CN]
		if len(m) == 0 {
			m = []string{l.BindDN} // groupOfNames needs a member
		}
		for _, dn := range m {
			fmt.Fprintf(&b, "member: %s\n", dn)
		}
		b.WriteString("\n")
	}
	ldif := filepath.Join(dir, "seed.ldif")
	if err := os.WriteFile(ldif, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("slapadd", "-f", confFile, "-l", ldif).CombinedOutput(); err != nil {
		t.Fatalf("slapadd: %v\n%s", err, out)
	}
	port := FreePort(t)
	l.URL = fmt.Sprintf("ldap://127.0.0.1:%d", port)
	Start(t, nil, "slapd", "-d", "0", "-f", confFile, "-h", l.URL+"/")
	if err := WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return l
}
