package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tsgclient"
)

// configGID stands for the deskway group the Debian package makes: any
// group but the image user's own.
const configGID = 64000

// TestContainerImage: the image tools/mkimage builds from the static
// binary, made and loaded into podman by the README's own lines (make
// image, podman load), holds Debian's CA bundle (not the build
// machine's), its time zones and a /tmp anyone may write to; started by
// docs/operations.md's podman run line as written, on a default podman,
// it reads a configuration that is root:GROUP 0640 as the package
// installs it, runs as its unprivileged user and carries a tunnel
// through the gateway to a host outside the container.
func TestContainerImage(t *testing.T) {
	// Its gateway is on ports the kernel chose, its container and volume
	// have names no other test uses, make image writes files of bin/ no
	// other test writes, and it judges no timing.
	parallel(t)
	testkit.RequireRoot(t)
	testkit.Require(t, "podman", "dpkg-query")
	// The README's lines, as written, from the top directory.
	block := readmeBlocks(t)["install-image"]
	if block == "" {
		t.Fatal("README.md has no block marked <!-- e2e: install-image -->")
	}
	image := loadImage(t, exec.Command("bash", "-ec", block))

	out, err := exec.Command("podman", "image", "inspect", image).Output()
	if err != nil {
		t.Fatalf("podman image inspect: %v", err)
	}
	var info []struct {
		Config struct {
			User       string
			Entrypoint []string
			Labels     map[string]string
		}
		Size int64
	}
	if err := json.Unmarshal(out, &info); err != nil || len(info) != 1 {
		t.Fatalf("podman image inspect: %v %s", err, out)
	}
	if info[0].Config.User != "65532:65532" || strings.Join(info[0].Config.Entrypoint, " ") != "/usr/bin/deskway" {
		t.Fatalf("image config: %+v", info[0].Config)
	}
	for _, pkg := range []string{"ca-certificates", "tzdata"} {
		v, _ := exec.Command("dpkg-query", "-W", "-f=${Version}", pkg).Output()
		if got := info[0].Config.Labels["deskway.debian."+pkg]; got != string(v) {
			t.Errorf("label deskway.debian.%s = %q, want the installed %q", pkg, got, v)
		}
	}
	t.Logf("image %s: %d MB", image, info[0].Size>>20)
	checkImageFiles(t, "../bin/deskway-image.tar")

	// The configuration as the Debian package leaves it: root:GROUP,
	// unreadable by anyone else.
	port, adminPort := testkit.FreePort(t), testkit.FreePort(t)
	key := strings.Repeat("k", 32)
	cfgDir := t.TempDir()
	cfg := fmt.Sprintf(`state_dir: /var/lib/deskway
log: {level: info, format: text}
admin: {listen: "127.0.0.1:%d"}
auth: {token_key: %q}
gateway:
  listen: "127.0.0.1:%d"
  auth_methods: [paa]
  resource_policies: [{name: hosts, users: ["*"], hosts: [127.0.0.1]}]
  connection_policies: [{name: all, users: ["*"]}]
`, adminPort, key, port)
	cfgFile := filepath.Join(cfgDir, "deskway.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o640); err != nil {
		t.Fatal(err)
	}
	for path, mode := range map[string]os.FileMode{cfgDir: 0o750, cfgFile: 0o640} {
		if err := os.Chown(path, 0, configGID); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}

	// docs/operations.md's line, with only the image's tag and the
	// configuration's directory filled in.
	line := docBlock(t, "../docs/operations.md", "image-run")
	for old, repl := range map[string]string{
		"localhost/deskway:TAG": image,
		"-v /etc/deskway:":      "-v " + cfgDir + ":",
	} {
		if !strings.Contains(line, old) {
			t.Fatalf("docs/operations.md's image-run line has no %q:\n%s", old, line)
		}
		line = strings.ReplaceAll(line, old, repl)
	}
	line = strings.ReplaceAll(line, " /etc/deskway/deskway.yaml)", " "+cfgFile+")") // the host's file, for --group-add
	const name, volume = "deskway-gateway", "deskway-state"                         // the line's own
	removeContainer := func() {
		_ = exec.Command("podman", "rm", "-f", "-t", "5", name).Run()
		_ = exec.Command("podman", "volume", "rm", "-f", volume).Run()
	}
	removeContainer() // a run killed before its cleanup
	if out, err := exec.Command("bash", "-ec", line).CombinedOutput(); err != nil {
		t.Fatalf("docs/operations.md's podman run line: %v\n%s\n%s", err, line, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("podman", "logs", name).CombinedOutput()
			t.Logf("the container's output:\n%s", out)
		}
		removeContainer()
	})
	gw := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(30 * time.Second); ; {
		if testkit.WaitPort(gw, time.Second) == nil {
			break
		}
		if out, _ := exec.Command("podman", "inspect", "-f", "{{.State.Running}}", name).Output(); strings.TrimSpace(string(out)) != "true" {
			t.Fatal("the container stopped before its gateway listened")
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway in the container did not listen on %s in 30s", gw)
		}
	}
	out, err = exec.Command("podman", "inspect", "-f", "{{.State.Pid}}", name).Output()
	if err != nil {
		t.Fatalf("podman inspect: %v", err)
	}
	status, err := os.ReadFile("/proc/" + strings.TrimSpace(string(out)) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^Uid:\s+65532\s`).Match(status) || !regexp.MustCompile(`(?m)^Groups:.*\b`+strconv.Itoa(configGID)+`\b`).Match(status) {
		t.Fatalf("the process in the container is not user 65532 with group %d:\n%s", configGID, status)
	}

	// A tunnel through it to an echo host outside the container.
	echo := testkit.Echo(t)
	_, p, _ := strings.Cut(echo, ":")
	var echoPort uint16
	fmt.Sscan(p, &echoPort)
	tokens, err := auth.NewTokens([]byte(key), nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokens.Mint("someone", nil, "127.0.0.1", int(echoPort), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, clientTLS, _, _ := testkit.TLS(t)
	clientTLS.InsecureSkipVerify = true
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := tsgclient.Dial(ctx, tsgclient.Config{Gateway: gw, TLS: clientTLS, Token: tok}, "127.0.0.1", echoPort)
	if err != nil {
		t.Fatalf("a tunnel through the containerised gateway: %v", err)
	}
	defer c.Close()
	msg := []byte("through the container")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo: %q %v", got, err)
	}
}

// loadImage runs cmd from the top directory, which ends in podman load,
// and returns the image it loaded, removed at test end.
func loadImage(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, lastLines(string(out), 30))
	}
	m := regexp.MustCompile(`Loaded image(?:\(s\))?: (\S+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("podman load named no image:\n%s", lastLines(string(out), 10))
	}
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "-f", m[1]).Run() })
	return m[1]
}

// docBlock returns the shell block of a document marked
// "<!-- e2e: NAME -->".
func docBlock(t *testing.T, doc, name string) string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- e2e: " + regexp.QuoteMeta(name) + " -->\n```sh\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s has no block marked <!-- e2e: %s -->", doc, name)
	}
	return string(m[1])
}

// checkImageFiles reads the image archive's file system: /tmp is 1777;
// the CA bundle holds the ca-certificates package's certificates and not
// those this machine's administrator added; a time zone is there.
func checkImageFiles(t *testing.T, archive string) {
	t.Helper()
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string][]byte{}
	modes := map[string]int64{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		modes[h.Name] = h.Mode
		if h.Name == "etc/ssl/certs/ca-certificates.crt" || h.Name == "usr/share/zoneinfo/Asia/Kolkata" {
			if files[h.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if modes["tmp"] != 0o1777 {
		t.Errorf("/tmp has mode %o, want 1777", modes["tmp"])
	}
	if !bytes.HasPrefix(files["usr/share/zoneinfo/Asia/Kolkata"], []byte("TZif")) {
		t.Error("the image has no /usr/share/zoneinfo/Asia/Kolkata")
	}
	inBundle := map[string]bool{}
	for rest := files["etc/ssl/certs/ca-certificates.crt"]; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		inBundle[string(blk.Bytes)] = true
	}
	list, err := exec.Command("dpkg-query", "-L", "ca-certificates").Output()
	if err != nil {
		t.Fatal(err)
	}
	var want, missing []string
	for _, f := range strings.Fields(string(list)) {
		if strings.HasPrefix(f, "/usr/share/ca-certificates/") && strings.HasSuffix(f, ".crt") {
			want = append(want, f)
			if c := pemCert(t, f); c == nil || !inBundle[string(c.Raw)] {
				missing = append(missing, f)
			}
		}
	}
	if len(missing) > 0 || len(inBundle) != len(want) || len(want) < 100 {
		t.Errorf("the image's CA bundle holds %d certificates, the ca-certificates package %d; it lacks %d of them, such as %q",
			len(inBundle), len(want), len(missing), missing[:min(3, len(missing))])
	}
	local, _ := filepath.Glob("/usr/local/share/ca-certificates/*.crt")
	for _, f := range local {
		if c := pemCert(t, f); c != nil && inBundle[string(c.Raw)] {
			t.Errorf("the image's CA bundle holds this machine's own %s", f)
		}
	}
}

func pemCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil
	}
	return c
}
