package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tsgclient"
)

// podman runs podman with what this machine's containers need: runc
// (crun refuses hybrid cgroups), cgroupfs (no systemd), and limits within
// the test runner's own.
func podman(args ...string) *exec.Cmd {
	base := []string{"--runtime", "runc", "--cgroup-manager", "cgroupfs"}
	return exec.Command("podman", append(base, args...)...)
}

// TestContainerImage: the image tools/mkimage builds from the static
// binary, made and loaded into podman by the README's own lines (make
// image, podman load), runs as its unprivileged user
// with the configuration from a volume, and carries a tunnel through
// the gateway it runs to a host outside the container.
func TestContainerImage(t *testing.T) {
	testkit.RequireRoot(t)
	testkit.Require(t, "podman", "runc")
	// The README's lines, as written, from the top directory.
	block := readmeBlocks(t)["install-image"]
	if block == "" {
		t.Fatal("README.md has no block marked <!-- e2e: install-image -->")
	}
	inst := exec.Command("bash", "-ec", block)
	inst.Dir = ".."
	out, err := inst.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's install-image lines: %v\n%s", err, lastLines(string(out), 30))
	}
	m := regexp.MustCompile(`Loaded image(?:\(s\))?: (\S+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("podman load named no image:\n%s", lastLines(string(out), 10))
	}
	image := m[1]
	t.Cleanup(func() { _ = podman("rmi", "-f", image).Run() })

	out, err = podman("image", "inspect", image).Output()
	if err != nil {
		t.Fatalf("podman image inspect: %v", err)
	}
	var info []struct {
		Config struct {
			User       string
			Entrypoint []string
		}
		Size int64
	}
	if err := json.Unmarshal(out, &info); err != nil || len(info) != 1 {
		t.Fatalf("podman image inspect: %v %s", err, out)
	}
	if info[0].Config.User != "65532:65532" || strings.Join(info[0].Config.Entrypoint, " ") != "/usr/bin/deskway" {
		t.Fatalf("image config: %+v", info[0].Config)
	}
	t.Logf("image %s: %d MB", image, info[0].Size>>20)

	// The gateway role, its configuration mounted read-only.
	port := testkit.FreePort(t)
	key := strings.Repeat("k", 32)
	cfgDir := t.TempDir()
	os.Chmod(cfgDir, 0o755)
	cfg := fmt.Sprintf(`state_dir: /var/lib/deskway
log: {level: info, format: text}
auth: {token_key: %q}
gateway:
  listen: "127.0.0.1:%d"
  auth_methods: [paa]
  resource_policies: [{name: hosts, users: ["*"], hosts: [127.0.0.1]}]
  connection_policies: [{name: all, users: ["*"]}]
`, key, port)
	if err := os.WriteFile(filepath.Join(cfgDir, "deskway.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("deskway-e2e-%d", port)
	run := podman("run", "--rm", "--name", name, "--network", "host", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
		"-v", cfgDir+":/etc/deskway:ro", image, "gateway", "-c", "/etc/deskway/deskway.yaml")
	var log testkit.Buffer
	run.Stdout, run.Stderr = &log, &log
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = podman("stop", "-t", "5", name).Run()
		_ = run.Wait()
		if t.Failed() {
			t.Logf("the container's output:\n%s", log.String())
		}
	})
	gw := fmt.Sprintf("127.0.0.1:%d", port)
	if err := testkit.WaitPort(gw, 30*time.Second); err != nil {
		t.Fatalf("the gateway in the container did not listen: %v\n%s", err, log.String())
	}
	if out, err := podman("top", name, "huser", "user").CombinedOutput(); err != nil || !strings.Contains(string(out), "65532") || !strings.Contains(string(out), "deskway") {
		t.Fatalf("the process in the container does not run as 65532: %v\n%s", err, out)
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
		t.Fatalf("a tunnel through the containerised gateway: %v\n%s", err, log.String())
	}
	defer c.Close()
	msg := []byte("through the container")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := c.Read(got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo: %q %v", got, err)
	}
}
