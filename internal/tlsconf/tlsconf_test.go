package tlsconf

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSelfSignedNamesTheMachine: a client that is shown the certificate
// (mstsc's warning, xfreerdp's prompt) must see which server it is.
func TestSelfSignedNamesTheMachine(t *testing.T) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		t.Fatalf("host name: %q %v", host, err)
	}
	for _, tc := range []struct {
		hosts  []string
		wantCN string
	}{
		{nil, host},
		{[]string{"gw.example.test"}, "gw.example.test"},
	} {
		dir := t.TempDir()
		cf, kf := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
		if err := SelfSigned(cf, kf, tc.hosts); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(cf)
		blk, _ := pem.Decode(b)
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if cert.Subject.CommonName != tc.wantCN || !slices.Contains(cert.DNSNames, host) {
			t.Fatalf("hosts %v: subject %q, names %v; want subject %q and %q among the names", tc.hosts, cert.Subject.CommonName, cert.DNSNames, tc.wantCN, host)
		}
		if err := cert.VerifyHostname(host); err != nil {
			t.Fatalf("not valid for the machine's name: %v", err)
		}
	}
}

// TestTrustingTrustsOnlyThatCertificate: a client built on Trusting
// reaches the server holding the certificate, and no other.
func TestTrustingTrustsOnlyThatCertificate(t *testing.T) {
	dir := t.TempDir()
	mine, other := filepath.Join(dir, "mine.pem"), filepath.Join(dir, "other.pem")
	if err := SelfSigned(mine, filepath.Join(dir, "mine.key"), []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if err := SelfSigned(other, filepath.Join(dir, "other.key"), []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	tc, err := Trusting(mine)
	if err != nil {
		t.Fatal(err)
	}
	verify := func(certFile string) error {
		b, _ := os.ReadFile(certFile)
		blk, _ := pem.Decode(b)
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cert.Verify(x509.VerifyOptions{Roots: tc.RootCAs, DNSName: "127.0.0.1"})
		return err
	}
	if err := verify(mine); err != nil {
		t.Errorf("the trusted certificate: %v", err)
	}
	if err := verify(other); err == nil {
		t.Error("another self-signed certificate verified")
	}
	empty := filepath.Join(dir, "empty.pem")
	_ = os.WriteFile(empty, []byte("not a certificate"), 0o600)
	if _, err := Trusting(empty); err == nil {
		t.Error("a file with no certificate gave a configuration that trusts nothing")
	}
}
