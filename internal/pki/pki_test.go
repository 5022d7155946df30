package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestIssueAndVerify: a client certificate verifies against the CA with
// its name and roles; one from another CA does not; the CA persists.
func TestIssueAndVerify(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v %v", fi, err)
	}
	again, err := LoadOrCreate(dir)
	if err != nil || !again.Cert.Equal(ca.Cert) {
		t.Fatalf("the CA was not kept: %v", err)
	}
	certPEM, keyPEM, err := ca.Issue("pc1", []string{RoleMaintenance}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	cert, _ := x509.ParseCertificate(blk.Bytes)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
	id := IdentityOf(cert)
	if id.Client != "pc1" || !id.Has(RoleMaintenance) {
		t.Fatalf("identity %+v", id)
	}
	other, _ := LoadOrCreate(t.TempDir())
	if _, err := cert.Verify(x509.VerifyOptions{Roots: other.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("a certificate verified against another CA")
	}
	sc, err := ca.ServerCert(dir, []string{"nbd.example.test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "nbd.example.test"}); err != nil {
		t.Fatal(err)
	}
}
