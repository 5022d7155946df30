package testkit

import (
	"crypto/tls"
	"io"
	"net"
	"testing"

	"github.com/deskway/deskway/internal/proto/x224"
)

// FakeRDP listens on a loopback port and answers as an RDP server's
// listener does up to the end of its TLS handshake: each X.224
// Connection Request gets a Confirm selecting TLS, then the handshake.
// It stands in for xrdp where a test needs a host that answers the
// agent's check of its RDP service but never a session. It returns the
// port.
func FakeRDP(t testing.TB) int {
	t.Helper()
	srv, _, _, _ := TLS(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// An X.224 Connection Confirm whose RDP Negotiation Response selects
	// PROTOCOL_SSL.
	confirm := []byte{3, 0, 0, 19, 14, 0xd0, 0, 0, 0x12, 0x34, 0, 0x02, 0, 8, 0, byte(x224.ProtocolSSL), 0, 0, 0}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				hdr := make([]byte, 4)
				if _, err := io.ReadFull(c, hdr); err != nil {
					return
				}
				n, err := x224.TPKTLen(hdr)
				if err != nil || n < 4 {
					return
				}
				if _, err := io.CopyN(io.Discard, c, int64(n-4)); err != nil {
					return
				}
				if _, err := c.Write(confirm); err != nil {
					return
				}
				_ = tls.Server(c, srv).Handshake()
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}
