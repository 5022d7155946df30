package policy

import (
	"context"
	"crypto/hmac"
	"crypto/md5"
	"errors"
	"fmt"
	"strings"
	"time"

	"layeh.com/radius"
	"layeh.com/radius/rfc2865"
	"layeh.com/radius/rfc2869"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/tsgu"
)

// serviceTypeAuthorizeOnly (RFC 5176) asks for an authorization decision
// without credentials: the gateway has already authenticated the user.
const serviceTypeAuthorizeOnly rfc2865.ServiceType = 17

// RADIUS asks a central policy server (Microsoft NPS, FreeRADIUS) whether
// a user may open a tunnel, as an RD Gateway with a central NPS does. An
// Access-Accept may carry Filter-Id attributes; each is taken as a group.
type RADIUS struct {
	addr          string
	secret        []byte
	timeout       time.Duration
	nasID         string
	allowUnsigned bool
}

// NewRADIUS returns a client for the configured server.
func NewRADIUS(c *config.RADIUS) *RADIUS {
	return &RADIUS{addr: c.Server, secret: []byte(c.Secret.Value()), timeout: c.Timeout.D(), nasID: c.NASIdentifier,
		allowUnsigned: c.AllowUnsignedResponses}
}

// Authorize sends an Access-Request for id and returns the groups the
// server assigned, or a *Denied saying why not.
func (r *RADIUS) Authorize(ctx context.Context, id Identity) ([]string, error) {
	p := radius.New(radius.CodeAccessRequest, r.secret)
	if err := rfc2865.UserName_SetString(p, id.User); err != nil {
		return nil, fmt.Errorf("radius: user name: %w", err)
	}
	_ = rfc2865.ServiceType_Set(p, serviceTypeAuthorizeOnly)
	_ = rfc2865.NASIdentifier_SetString(p, r.nasID)
	if id.Source.IsValid() {
		_ = rfc2865.CallingStationID_SetString(p, id.Source.String())
	}
	if err := signMessageAuthenticator(p); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	client := &radius.Client{Retry: time.Second}
	resp, err := client.Exchange(ctx, p, r.addr)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, &Denied{tsgu.EProxyNAPAccessDenied, fmt.Sprintf("RADIUS server %s did not answer within %s", r.addr, r.timeout)}
		}
		return nil, &Denied{tsgu.EProxyNAPAccessDenied, fmt.Sprintf("RADIUS server %s: %v", r.addr, err)}
	}
	if err := checkMessageAuthenticator(resp, p.Authenticator, r.allowUnsigned); err != nil {
		return nil, &Denied{tsgu.EProxyNAPAccessDenied, err.Error()}
	}
	switch resp.Code {
	case radius.CodeAccessAccept:
		groups, _ := rfc2865.FilterID_GetStrings(resp)
		return groups, nil
	case radius.CodeAccessReject:
		msg := strings.TrimSpace(rfc2865.ReplyMessage_GetString(resp))
		if msg == "" {
			msg = "no reason given"
		}
		return nil, &Denied{tsgu.EProxyNAPAccessDenied, fmt.Sprintf("RADIUS server rejected %s: %s", id.User, msg)}
	default:
		return nil, &Denied{tsgu.EProxyNAPAccessDenied, fmt.Sprintf("RADIUS server answered %s", resp.Code)}
	}
}

// signMessageAuthenticator adds Message-Authenticator (RFC 3579 3.2), which
// servers hardened against forged responses require on every request.
func signMessageAuthenticator(p *radius.Packet) error {
	if err := rfc2869.MessageAuthenticator_Set(p, make([]byte, 16)); err != nil {
		return fmt.Errorf("radius: %w", err)
	}
	raw, err := p.MarshalBinary()
	if err != nil {
		return fmt.Errorf("radius: encode: %w", err)
	}
	m := hmac.New(md5.New, p.Secret)
	m.Write(raw)
	return rfc2869.MessageAuthenticator_Set(p, m.Sum(nil))
}

// checkMessageAuthenticator verifies the response's Message-Authenticator,
// computed over the response with the request's authenticator in place
// of its own. A response without one is refused: the Response
// Authenticator alone is MD5, which an attacker on the path can forge by
// a chosen-prefix collision (CVE-2024-3596, "Blast-RADIUS"); servers
// with that fixed (FreeRADIUS 3.2.5 on, and Debian's patched 3.2.1) sign
// every response to a request that was signed.
func checkMessageAuthenticator(resp *radius.Packet, reqAuth [16]byte, allowUnsigned bool) error {
	got := rfc2869.MessageAuthenticator_Get(resp)
	if got == nil {
		if allowUnsigned {
			return nil
		}
		return errors.New("RADIUS response has no Message-Authenticator; refusing it, as an unsigned response can be forged (CVE-2024-3596): " +
			"have the server sign every answer (FreeRADIUS before 3.2.5: update reply { Message-Authenticator := 0x00 } in post-auth), " +
			"or set gateway.radius.allow_unsigned_responses")
	}
	cp := *resp
	cp.Attributes = append(radius.Attributes(nil), resp.Attributes...)
	cp.Authenticator = reqAuth
	if err := rfc2869.MessageAuthenticator_Set(&cp, make([]byte, 16)); err != nil {
		return err
	}
	raw, err := cp.MarshalBinary()
	if err != nil {
		return err
	}
	m := hmac.New(md5.New, resp.Secret)
	m.Write(raw)
	if !hmac.Equal(got, m.Sum(nil)) {
		return errors.New("RADIUS response has a bad Message-Authenticator (wrong shared secret?)")
	}
	return nil
}
