package policy

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/tsgu"
)

type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func testEngine(t *testing.T) *Engine {
	t.Helper()
	c, err := config.Parse([]byte(`
auth:
  token_key: "0123456789abcdef0123456789abcdef"
gateway:
  connection_policies:
  - name: staff
    groups: [staff]
    redirection: [clipboard]
    idle_timeout: 10m
  - name: contractors
    users: [carol]
    auth_methods: [paa]
  resource_policies:
  - name: rdsh
    groups: [staff]
    hosts: [10.1.0.0/16, jump.corp]
    ports: [3389]
  - name: carol
    users: [carol]
    hosts: [10.1.2.3]
`))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(c.Gateway, fakeResolver{
		"rdsh1.corp": {netip.MustParseAddr("10.1.0.5")},
		"evil.corp":  {netip.MustParseAddr("192.168.1.1")},
		"jump.corp":  {netip.MustParseAddr("172.16.0.1")},
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestConnect(t *testing.T) {
	e := testEngine(t)
	g, err := e.Connect(Identity{User: "alice", Groups: []string{"Staff"}, Method: MethodNTLM})
	if err != nil || g.Policy != "staff" || g.IdleTimeout.Minutes() != 10 {
		t.Fatalf("alice: %+v %v", g, err)
	}
	want := tsgu.RedirDisableDrive | tsgu.RedirDisablePrinter | tsgu.RedirDisablePort | tsgu.RedirDisablePnP
	if g.RedirFlags != want {
		t.Fatalf("redir flags %x want %x", g.RedirFlags, want)
	}
	var d *Denied
	if _, err := e.Connect(Identity{User: "carol", Method: MethodNTLM}); !errors.As(err, &d) || d.Code != tsgu.EProxyNAPAccessDenied {
		t.Fatalf("carol with NTLM: %v", err)
	}
	if _, err := e.Connect(Identity{User: "carol", Method: MethodPAA}); err != nil {
		t.Fatalf("carol with PAA: %v", err)
	}
	if _, err := e.Connect(Identity{User: "mallory", Method: MethodNTLM}); err == nil {
		t.Fatal("user in no policy admitted")
	}
}

func TestResource(t *testing.T) {
	e := testEngine(t)
	staff := Identity{User: "alice", Groups: []string{"staff"}}
	cases := []struct {
		id   Identity
		name string
		port uint16
		ok   bool
		addr string
	}{
		{staff, "rdsh1.corp", 3389, true, "10.1.0.5:3389"},
		{staff, "10.1.9.9", 3389, true, "10.1.9.9:3389"},
		{staff, "RDSH1.corp.", 3389, true, "10.1.0.5:3389"},
		{staff, "rdsh1.corp", 22, false, ""},
		{staff, "evil.corp", 3389, false, ""},
		{staff, "jump.corp", 3389, true, "172.16.0.1:3389"},
		{staff, "10.2.0.1", 3389, false, ""},
		{staff, "nohost.corp", 3389, false, ""},
		{Identity{User: "carol"}, "10.1.2.3", 4000, true, "10.1.2.3:4000"},
		{Identity{User: "carol"}, "10.1.2.4", 3389, false, ""},
	}
	for _, c := range cases {
		tg, err := e.Resource(context.Background(), c.id, c.name, c.port)
		if c.ok != (err == nil) {
			t.Errorf("%s -> %s:%d: ok=%v err=%v", c.id.User, c.name, c.port, c.ok, err)
			continue
		}
		if c.ok && tg.Addr.String() != c.addr {
			t.Errorf("%s:%d dials %s, want %s", c.name, c.port, tg.Addr, c.addr)
		}
	}
}

func TestDenyByDefault(t *testing.T) {
	c, err := config.Parse([]byte("gateway:\n  auth_methods: [ntlm]\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := New(c.Gateway, fakeResolver{})
	if _, err := e.Connect(Identity{User: "a", Groups: []string{"x"}, Method: MethodNTLM}); err == nil {
		t.Fatal("no CAP but connection admitted")
	}
	if _, err := e.Resource(context.Background(), Identity{User: "a"}, "127.0.0.1", 3389); err == nil {
		t.Fatal("no RAP but resource admitted")
	}
}
