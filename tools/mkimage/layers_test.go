package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestReadCerts: -extra-ca takes a file of certificates, comments
// around them allowed; a key, a broken certificate or a file with none
// is refused, not ignored by every TLS client in the image.
func TestReadCerts(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for name, c := range map[string]struct {
		body []byte
		ok   bool
	}{
		"cert":        {cert, true},
		"two certs":   {append(append([]byte{}, cert...), cert...), true},
		"key":         {append(append([]byte{}, cert...), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})...), false},
		"empty":       {nil, false},
		"comments":    {append(append([]byte("# test CA\n"), cert...), "# end\n"...), true},
		"no PEM":      {[]byte("not a certificate\n"), false},
		"broken cert": {pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("nope")}), false},
	} {
		f := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(f, c.body, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readCerts(f); (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok %v", name, err, c.ok)
		}
	}
}
