package policy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"layeh.com/radius"
	"layeh.com/radius/rfc2865"
	"layeh.com/radius/rfc2869"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/tsgu"
	"github.com/deskway/deskway/internal/testkit"
)

// RADIUSUsers is the central policy the tests run FreeRADIUS with.
const radiusUsers = `alice	Auth-Type := Accept
	Filter-Id = "staff",
	Filter-Id = "vpn"

mallory	Auth-Type := Reject
	Reply-Message = "blocked by central policy"

DEFAULT	Auth-Type := Reject
`

func TestRADIUSAgainstFreeRADIUS(t *testing.T) {
	addr, secret := testkit.FreeRADIUS(t, radiusUsers)
	r := NewRADIUS(&config.RADIUS{Server: addr, Secret: config.NewSecret(secret), Timeout: config.Duration(3 * time.Second), NASIdentifier: "gw-test"})
	ctx := context.Background()
	groups, err := r.Authorize(ctx, Identity{User: "alice", Source: netip.MustParseAddr("127.0.0.1")})
	if err != nil || strings.Join(groups, ",") != "staff,vpn" {
		t.Fatalf("alice: groups %v err %v", groups, err)
	}
	var d *Denied
	_, err = r.Authorize(ctx, Identity{User: "mallory"})
	if !errors.As(err, &d) || d.Code != tsgu.EProxyNAPAccessDenied || !strings.Contains(d.Reason, "blocked by central policy") {
		t.Fatalf("mallory: %v", err)
	}
	if _, err := r.Authorize(ctx, Identity{User: "stranger"}); !errors.As(err, &d) {
		t.Fatalf("unknown user accepted: %v", err)
	}
	// A wrong shared secret: FreeRADIUS drops the request, we time out and say so.
	bad := NewRADIUS(&config.RADIUS{Server: addr, Secret: config.NewSecret("wrong"), Timeout: config.Duration(1500 * time.Millisecond)})
	if _, err := bad.Authorize(ctx, Identity{User: "alice"}); !errors.As(err, &d) || !strings.Contains(d.Reason, "did not answer") {
		t.Fatalf("wrong secret: %v", err)
	}
}

// fakeRADIUS answers every Access-Request with an Access-Accept that
// carries a correct Response Authenticator (the shared secret is right)
// and, as set, a Message-Authenticator: forged, or none.
func fakeRADIUS(t *testing.T, secret string, forge bool) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &radius.PacketServer{SecretSource: radius.StaticSecretSource([]byte(secret)),
		Handler: radius.HandlerFunc(func(w radius.ResponseWriter, r *radius.Request) {
			resp := r.Response(radius.CodeAccessAccept)
			_ = rfc2865.FilterID_AddString(resp, "admins")
			if forge {
				_ = rfc2869.MessageAuthenticator_Set(resp, bytes.Repeat([]byte{0x5a}, 16))
			}
			_ = w.Write(resp)
		})}
	go func() { _ = srv.Serve(pc) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return pc.LocalAddr().String()
}

// TestRADIUSForgedMessageAuthenticator: a response whose
// Message-Authenticator does not verify, or that has none (what an
// attacker forging a response by an MD5 collision of the Response
// Authenticator sends, CVE-2024-3596), grants nothing.
func TestRADIUSForgedMessageAuthenticator(t *testing.T) {
	for _, forge := range []bool{true, false} {
		addr := fakeRADIUS(t, "s3cret", forge)
		r := NewRADIUS(&config.RADIUS{Server: addr, Secret: config.NewSecret("s3cret"), Timeout: config.Duration(3 * time.Second)})
		groups, err := r.Authorize(context.Background(), Identity{User: "alice"})
		var d *Denied
		if !errors.As(err, &d) || !strings.Contains(d.Reason, "Message-Authenticator") {
			t.Fatalf("forged %v: groups %v, err %v; want a denial naming the Message-Authenticator", forge, groups, err)
		}
	}
	// A server that cannot sign is taken only when the operator says so;
	// a forged signature never is.
	for _, forge := range []bool{false, true} {
		r := NewRADIUS(&config.RADIUS{Server: fakeRADIUS(t, "s3cret", forge), Secret: config.NewSecret("s3cret"),
			Timeout: config.Duration(3 * time.Second), AllowUnsignedResponses: true})
		groups, err := r.Authorize(context.Background(), Identity{User: "alice"})
		if ok := err == nil && len(groups) == 1; ok == forge {
			t.Fatalf("allow_unsigned_responses, forged %v: groups %v, err %v", forge, groups, err)
		}
	}
}
