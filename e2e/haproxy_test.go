package e2e

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// shippedHAProxy starts HAProxy with one of deploy/haproxy's files as
// shipped, with only its addresses replaced (old → new, each of which the
// file must hold): the listener, the servers and the stats socket's path.
// It returns the stats socket's path here.
func shippedHAProxy(t *testing.T, file, bind string, addrs ...string) (*testkit.Process, string) {
	t.Helper()
	body, err := os.ReadFile(filepath.Join("..", "deploy", "haproxy", file))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	cfg := string(body)
	addrs = append(addrs, "/run/haproxy/admin.sock", sock)
	for i := 0; i+1 < len(addrs); i += 2 {
		if strings.Count(cfg, addrs[i]) != 1 {
			t.Fatalf("%s holds %q %d times, want once", file, addrs[i], strings.Count(cfg, addrs[i]))
		}
		cfg = strings.Replace(cfg, addrs[i], addrs[i+1], 1)
	}
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	lb := testkit.Start(t, nil, "haproxy", "-db", "-f", path)
	if err := testkit.WaitPort(bind, 10*time.Second); err != nil {
		t.Fatalf("haproxy: %v\n%s", err, lb.Log.String())
	}
	// HAProxy binds its stats socket under a temporary name and renames
	// it into place, so the listener can answer before the socket exists.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy's stats socket: %v\n%s", err, lb.Log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return lb, sock
}

// haproxyCommand sends one command to HAProxy's stats socket, as socat
// would, and returns the answer.
func haproxyCommand(t *testing.T, sock, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatalf("HAProxy's stats socket: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	out, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return string(out)
}

// serverStatus is a server's status column (UP, DRAIN, DOWN...) in
// HAProxy's "show stat".
func serverStatus(t *testing.T, sock, backend, server string) string {
	t.Helper()
	return serverStat(t, sock, backend, server)[17]
}

// serverStat is a server's row of HAProxy's "show stat", split into its
// columns (15 wretr: retries on the same server; 16 wredis: redispatches
// to another; 17 status).
func serverStat(t *testing.T, sock, backend, server string) []string {
	t.Helper()
	for _, line := range strings.Split(haproxyCommand(t, sock, "show stat"), "\n") {
		f := strings.Split(line, ",")
		if len(f) > 17 && f[0] == backend && f[1] == server {
			return f
		}
	}
	t.Fatalf("show stat names no %s/%s", backend, server)
	return nil
}
