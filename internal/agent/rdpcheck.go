package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/deskway/deskway/internal/proto/x224"
)

// rdpCheckTimeout bounds one check of the host's RDP listener: a service
// that takes longer to answer a connection is not one users can reach.
const rdpCheckTimeout = 5 * time.Second

// CheckRDP connects to the RDP service at addr as a client would: the
// X.224 Connection Request asking for TLS, then, when the service picks
// it, the TLS handshake. A listening socket whose program hangs, or one
// that refuses TLS, fails as a stopped service does: the gateway could
// not use either. The certificate is not checked; the gateway does that
// (or pins it) when it connects for a user.
func CheckRDP(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, rdpCheckTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write(x224.ConnectionRequestPacket(x224.ProtocolSSL)); err != nil {
		return fmt.Errorf("sending the X.224 Connection Request to %s: %w", addr, err)
	}
	hdr := make([]byte, x224.TPKTHeaderLen)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return fmt.Errorf("reading the X.224 Connection Confirm from %s: %w", addr, err)
	}
	n, err := x224.TPKTLen(hdr)
	if err != nil {
		return fmt.Errorf("the answer of %s: %w", addr, err)
	}
	pkt := make([]byte, n)
	copy(pkt, hdr)
	if _, err := io.ReadFull(c, pkt[len(hdr):]); err != nil {
		return fmt.Errorf("reading the X.224 Connection Confirm from %s: %w", addr, err)
	}
	cc, err := x224.ParseConnectionConfirm(pkt)
	if err != nil {
		return fmt.Errorf("the answer of %s: %w", addr, err)
	}
	if cc.Failure != 0 {
		return fmt.Errorf("%s refused TLS (RDP_NEG_FAILURE %d)", addr, cc.Failure)
	}
	if cc.Protocol != x224.ProtocolSSL {
		return fmt.Errorf("%s chose protocol %d, not the TLS asked for", addr, cc.Protocol)
	}
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // a liveness check; see above
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("TLS handshake with %s: %w", addr, err)
	}
	_ = tc.Close()
	return nil
}
