package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// checkKeyPair checks the certificate and key files every listener
// serves, as the start will load them: each readable, the certificate's
// PEM a certificate, the key's a private key, and the two a pair.
func checkKeyPair(bad badFunc, certKey, keyKey, certFile, keyFile string) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		bad(certKey, "%s", fileProblem(certFile, err))
	}
	keyPEM, kerr := os.ReadFile(keyFile)
	if kerr != nil {
		bad(keyKey, "%s", fileProblem(keyFile, kerr))
	}
	if err != nil || kerr != nil {
		return
	}
	if p := certsProblem(certFile, certPEM); p != "" {
		bad(certKey, "%s", p)
		return
	}
	if !hasPEM(keyPEM, "PRIVATE KEY") {
		bad(keyKey, "%s holds no PEM private key", keyFile)
		return
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		if strings.Contains(err.Error(), "does not match") {
			bad(keyKey, "%s is not the key of the certificate in %s (%s)", keyFile, certFile, certKey)
		} else {
			bad(keyKey, "%s cannot be used with %s: %s", keyFile, certFile, strings.TrimPrefix(err.Error(), "tls: "))
		}
	}
}

// checkCAFile checks a file of CA certificates that a connection's peer
// is checked against. The self-signed certificate a first start makes in
// the state directory (which deskway up names for its own agent) may not
// exist yet.
func (c *Config) checkCAFile(bad badFunc, key, path string) {
	if path == "" || (c.TLS.Cert == "" && filepath.Clean(path) == filepath.Join(c.StateDir, "tls.crt")) {
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		bad(key, "%s", fileProblem(path, err))
		return
	}
	if p := certsProblem(path, b); p != "" {
		bad(key, "%s", p)
	}
}

// certsProblem says what is wrong with a PEM file of certificates, ""
// when nothing.
func certsProblem(path string, b []byte) string {
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return fmt.Sprintf("%s holds a certificate that cannot be read: %v", path, strings.TrimPrefix(err.Error(), "x509: "))
		}
		n++
	}
	if n == 0 {
		return fmt.Sprintf("%s holds no PEM certificate", path)
	}
	return ""
}

func hasPEM(b []byte, typeSuffix string) bool {
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			return false
		}
		if strings.HasSuffix(blk.Type, typeSuffix) {
			return true
		}
	}
}

// fileProblem says in plain words why a file could not be read.
func fileProblem(path string, err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("%s does not exist", path)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Sprintf("%s cannot be read (permission denied)", path)
	case errors.Is(err, syscall.EISDIR):
		return fmt.Sprintf("%s is a directory, not a file", path)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Sprintf("%s cannot be read: %v", path, err)
}
