package e2e

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// TestContainerImageSystemRoots: a portal in the container reaches an
// OpenID provider whose certificate a test CA signed, with no web.oidc.ca:
// tools/mkimage put that CA in the image's bundle (-extra-ca), so the
// connection proves the bundle is the process's system roots. Its log
// times carry the offset of the TZ it is given, read from the image's
// zoneinfo.
func TestContainerImageSystemRoots(t *testing.T) {
	// Its binary and image are its own, its ports the kernel's choice;
	// it judges no timing.
	parallel(t)
	testkit.RequireRoot(t)
	testkit.Require(t, "podman", "dpkg-query")
	dir := t.TempDir()
	caDir, certFile, keyFile := testkit.CA(t)
	bin := filepath.Join(dir, "deskway-static")
	gobuild := exec.Command("go", "build", "-o", bin, "./cmd/deskway")
	gobuild.Dir, gobuild.Env = "..", append(os.Environ(), "CGO_ENABLED=0")
	if out, err := gobuild.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	adminPort, gwPort, brokerPort, webPort := testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
	image := loadImage(t, exec.Command("bash", "-ec", fmt.Sprintf(
		"go run ./tools/mkimage -bin %s -tag deskway-e2e-roots:%d -extra-ca %s -out %s\npodman load -i %[4]s",
		bin, webPort, filepath.Join(caDir, "ca-cert.pem"), filepath.Join(dir, "image.tar"))))

	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	public := fmt.Sprintf("https://127.0.0.1:%d", webPort)
	op := testkit.StartOIDCWithCert(t, cert, "deskway-portal", "portal-secret", []string{public + "/oidc/callback"},
		[]testkit.OIDCUser{{Username: "olga", Password: "Olga-OIDC-1", Groups: []string{"staff"}}})
	web := fmt.Sprintf(`web:
  listen: "127.0.0.1:%d"
  public_url: %s
  oidc:
    issuer: %s
    client_id: deskway-portal
    client_secret: portal-secret
`, webPort, public, op.Issuer)
	body := fmt.Sprintf(reloadConfig, "/var/lib/deskway", adminPort, gwPort, brokerPort, "")
	body = strings.Replace(body, "broker:\n", "broker:\n  frontend_tokens: [e2e-portal-token]\n", 1) + web
	cfgDir := t.TempDir()
	if err := os.Chmod(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "deskway.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}

	// The image's default command (run, every role of the file).
	name := fmt.Sprintf("deskway-e2e-roots-%d", webPort)
	run := exec.Command("podman", "run", "--rm", "--name", name, "--network", "host",
		"--ulimit", "nofile=4096", "--ulimit", "nproc=32768", "-e", "TZ=Asia/Kolkata",
		"-v", cfgDir+":/etc/deskway:ro", image)
	var log testkit.Buffer
	run.Stdout, run.Stderr = &log, &log
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command("podman", "stop", "-t", "5", name).Run()
		_ = run.Wait()
		if t.Failed() {
			t.Logf("the container's output:\n%s", log.String())
		}
	})
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", webPort), 30*time.Second); err != nil {
		t.Fatalf("the portal in the container did not listen: %v", err)
	}

	// Signing in starts with the portal fetching the provider's
	// configuration over TLS; only then does it send the browser there.
	client := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       30 * time.Second,
	}
	resp, err := client.Get(public + "/oidc/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc == nil || "https://"+loc.Host != op.Issuer {
		t.Fatalf("signing in: %s to %q, want a redirect to the provider %s", resp.Status, resp.Header.Get("Location"), op.Issuer)
	}
	if !regexp.MustCompile(`"time":"[0-9-]+T[0-9:.]+\+05:30"`).MatchString(log.String()) {
		t.Fatalf("no log time at +05:30 with TZ=Asia/Kolkata:\n%s", lastLines(log.String(), 5))
	}
}
