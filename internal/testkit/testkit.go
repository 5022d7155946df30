// Package testkit has helpers for tests that start real components on
// loopback: certificates, an echo host, waiting for ports, and named
// machine-wide locks (Lock, LockDuring) through which tests that run in
// parallel take turns at what the machine has one of, such as
// an xrdp setup (StartXRDP and NewXRDPNamespace take its lock). It is only
// imported from _test files and e2e tests.
package testkit

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/loopback"
	"github.com/deskway/deskway/internal/tlsconf"
)

// TLS makes a self-signed certificate for localhost in a temp dir and
// returns a server config and a client config that trusts it.
func TLS(t testing.TB) (server, client *tls.Config, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := tlsconf.SelfSigned(certFile, keyFile, nil); err != nil {
		t.Fatal(err)
	}
	server, err := tlsconf.Load(certFile, keyFile, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	pemBytes, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	blk, _ := pem.Decode(pemBytes)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool.AddCert(cert)
	return server, &tls.Config{RootCAs: pool, ServerName: "localhost"}, certFile, keyFile
}

// Echo starts a TCP server on loopback that writes back what it reads. It
// stands in for an RDP host. Stopped at test end.
func Echo(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// WaitPort waits until addr accepts TCP connections.
func WaitPort(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("testkit: " + addr + " did not open in " + timeout.String())
}

// WaitPortClosed waits until nothing accepts TCP connections on addr.
func WaitPortClosed(addr string, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; time.Sleep(200 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return nil
		}
		c.Close()
		if time.Now().After(deadline) {
			return errors.New("testkit: " + addr + " still accepts connections after " + timeout.String())
		}
	}
}

// FreePort returns a loopback port that was free a moment ago, from
// outside the range the kernel gives outgoing connections.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FreePorts returns n different free ports, for one server's listeners.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	p, err := loopback.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
