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
