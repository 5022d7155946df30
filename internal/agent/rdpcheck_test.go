package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/proto/x224"
	"github.com/deskway/deskway/internal/testkit"
)

// rdpListener answers each connection as confirm says: the X.224
// Connection Confirm bytes, then a TLS handshake when tlsAfter.
func rdpListener(t *testing.T, confirm []byte, tlsAfter bool) string {
	t.Helper()
	srv, _, _, _ := testkit.TLS(t)
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
			go func() {
				defer c.Close()
				req := make([]byte, 19)
				if _, err := io.ReadFull(c, req); err != nil || !bytes.Equal(req, x224.ConnectionRequestPacket(x224.ProtocolSSL)) {
					return
				}
				if _, err := c.Write(confirm); err != nil || !tlsAfter {
					return
				}
				_ = tls.Server(c, srv).Handshake()
			}()
		}
	}()
	return ln.Addr().String()
}

// TestCheckRDP: a service that confirms TLS and completes the handshake
// answers; one that refuses TLS, picks another protocol, closes at once,
// or is not there does not.
func TestCheckRDP(t *testing.T) {
	confirm := func(typ byte, value byte) []byte {
		return []byte{3, 0, 0, 19, 14, 0xd0, 0, 0, 0x12, 0x34, 0, typ, 0, 8, 0, value, 0, 0, 0}
	}
	ctx := context.Background()
	if err := CheckRDP(ctx, rdpListener(t, confirm(0x02, x224.ProtocolSSL), true)); err != nil {
		t.Fatalf("a TLS-speaking RDP service: %v", err)
	}
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	gone := closed.Addr().String()
	closed.Close()
	for name, c := range map[string]struct {
		addr, want string
	}{
		"refuses TLS":     {rdpListener(t, confirm(0x03, 2), false), "refused TLS"},
		"standard RDP":    {rdpListener(t, confirm(0x02, x224.ProtocolRDP), false), "not the TLS asked for"},
		"no TLS after it": {rdpListener(t, confirm(0x02, x224.ProtocolSSL), false), "TLS handshake"},
		"closes at once":  {rdpListener(t, nil, false), "Connection Confirm"},
		"not listening":   {gone, "connecting to"},
	} {
		if err := CheckRDP(ctx, c.addr); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
}
