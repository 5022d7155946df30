package policy

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

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
