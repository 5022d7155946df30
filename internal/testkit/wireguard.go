package testkit

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// BuildWireGuardGo builds wireguard-go's own program, at the version in
// go.mod, as an office's independent WireGuard peer.
func BuildWireGuardGo(t testing.TB) string {
	t.Helper()
	bin := t.TempDir() + "/wireguard-go"
	out, err := exec.Command("go", "build", "-o", bin, "golang.zx2c4.com/wireguard").CombinedOutput()
	if err != nil {
		t.Fatalf("go build wireguard-go: %v\n%s", err, out)
	}
	return bin
}

// WireGuardKey writes a private key made by wg genkey into dir and
// returns its path and the public key wg pubkey derives from it.
func WireGuardKey(t testing.TB, dir, name string) (path, public string) {
	t.Helper()
	priv, err := exec.Command("wg", "genkey").Output()
	if err != nil {
		t.Fatalf("wg genkey: %v", err)
	}
	path = dir + "/" + name + ".key"
	if err := os.WriteFile(path, priv, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("wg", "pubkey")
	cmd.Stdin = strings.NewReader(string(priv))
	pub, err := cmd.Output()
	if err != nil {
		t.Fatalf("wg pubkey: %v", err)
	}
	return path, strings.TrimSpace(string(pub))
}

// WireGuardOffice is an office's WireGuard router: wireguard-go running
// in a namespace the test made, configured by wg from wireguard-tools.
type WireGuardOffice struct {
	Netns  string // the namespace wireguard-go runs in
	Ifname string // its interface there
}

// StartWireGuardOffice runs the wireguard-go program bin in netns with a
// fresh interface, and configures it with wg: the key in keyFile, port
// 51820, the gateway (gwPub at gwEndpoint) as its one peer with allowed
// (comma-separated prefixes) as allowed IPs and routes, and addr on the
// interface if not empty. It is stopped at test end; its log is shown
// if the test failed.
func StartWireGuardOffice(t testing.TB, bin, netns, keyFile, addr, gwPub, gwEndpoint, allowed string) *WireGuardOffice {
	t.Helper()
	Require(t, "ip", "wg")
	var b [3]byte
	_, _ = rand.Read(b[:])
	o := &WireGuardOffice{Netns: netns, Ifname: "wgo" + hex.EncodeToString(b[:])}
	logf, err := os.Create(t.TempDir() + "/wireguard-go.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", netns, bin, "-f", o.Ifname)
	cmd.Env = append(os.Environ(), "LOG_LEVEL=verbose")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start wireguard-go: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("wireguard-go %s in %s:\n%s", o.Ifname, netns, b)
		}
	})
	sock := "/var/run/wireguard/" + o.Ifname + ".sock"
	for end := time.Now().Add(20 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("wireguard-go exited: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(end) {
			t.Fatalf("wireguard-go made no %s", sock)
		}
	}
	o.run(t, "ip", "netns", "exec", netns, "wg", "set", o.Ifname, "private-key", keyFile, "listen-port", "51820",
		"peer", gwPub, "endpoint", gwEndpoint, "allowed-ips", allowed)
	if addr != "" {
		o.run(t, "ip", "-n", netns, "addr", "add", addr, "dev", o.Ifname)
	}
	o.run(t, "ip", "-n", netns, "link", "set", o.Ifname, "up")
	for _, p := range strings.Split(allowed, ",") {
		o.run(t, "ip", "-n", netns, "route", "add", p, "dev", o.Ifname)
	}
	return o
}

// Handshakes is what wg says of the office's handshakes with its peers.
func (o *WireGuardOffice) Handshakes(t testing.TB) string {
	t.Helper()
	return o.run(t, "ip", "netns", "exec", o.Netns, "wg", "show", o.Ifname, "latest-handshakes")
}

func (o *WireGuardOffice) run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}
