// Package tlsconf loads the certificate every deskway listener serves, or
// makes a self-signed one in the state directory on first start.
package tlsconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Load returns a server TLS config from cert and key files, or, when both
// are empty, from a self-signed pair kept in stateDir (made if missing).
func Load(certFile, keyFile, stateDir string, hosts []string) (*tls.Config, error) {
	if certFile == "" {
		certFile = filepath.Join(stateDir, "tls.crt")
		keyFile = filepath.Join(stateDir, "tls.key")
		if _, err := os.Stat(certFile); os.IsNotExist(err) {
			if err := SelfSigned(certFile, keyFile, hosts); err != nil {
				return nil, err
			}
		}
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: load %s and %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// SelfSigned writes a new ECDSA P-256 certificate valid for hosts, the
// machine's host name and loopback. Its subject names the first of hosts,
// or else the machine, so a client's certificate warning says which
// server it is about.
func SelfSigned(certFile, keyFile string, hosts []string) error {
	if hn, err := os.Hostname(); err == nil && hn != "" {
		hosts = append(append([]string(nil), hosts...), hn)
	}
	cn := "deskway"
	for _, h := range hosts {
		if h != "" && net.ParseIP(h) == nil {
			cn = h
			break
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("tls: generate key: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"deskway self-signed"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(2, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range append(hosts, "localhost", "127.0.0.1", "::1") {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("tls: create certificate: %w", err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("tls: marshal key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(certFile), 0o700); err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return fmt.Errorf("tls: write key: %w", err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("tls: write certificate: %w", err)
	}
	return nil
}

// Trusting is a client configuration that trusts only the certificates in
// certFile: how a bench or a test reaches the servers it started with a
// self-signed certificate without turning verification off.
func Trusting(certFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("tls: trust %s: %w", certFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: trust %s: no PEM certificate in it", certFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
