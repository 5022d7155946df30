package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
	"github.com/deskway/deskway/internal/testkit"
)

// dialIn connects to addr from inside the network namespace ns (a name
// under /run/netns): the socket lives there for good.
func dialIn(ns, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread moves to ns, and the runtime ends a
		// locked thread with its goroutine instead of reusing it.
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// exited reports whether the child process pid has exited, from its
// waited state, without reaping it (its exec.Cmd's Wait still can): a
// zombie still answers kill(pid, 0), and ProcessState is only set by Wait.
func exited(t *testing.T, pid int) bool {
	t.Helper()
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("waitid %d: %v", pid, err)
	}
	// Linux clears info when the child has not exited.
	return info.Signo == int32(unix.SIGCHLD)
}

// addNetns makes a network namespace with its loopback up, removed at
// test end.
func addNetns(t *testing.T, prefix string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := prefix + hex.EncodeToString(b[:])
	runOK(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	runOK(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// nsStream is a stream server running in a network namespace of its own,
// reached by clients in another namespace over a veth pair.
type nsStream struct {
	srvNS, cliNS string
	addr         string // the NBD listener, 10.78.0.1
	http         *http.Client
	admin        string
	log          *testkit.Process
}

const nsStreamConfig = `state_dir: %[1]s
log: {level: debug, format: text}
admin: {listen: "127.0.0.1:9443", tokens: [tok]}
tls: {cert: %[2]s, key: %[3]s}
stream:
  listen: "10.78.0.1:10809"
  tls: "off"
  clients: open
  vdisks:
  - {name: golden, base: %[4]s}
  - {name: personal, base: %[4]s, mode: private, clients: [alice]}
`

// startNSStream runs deskway stream in a new namespace at 10.78.0.1,
// with a client namespace at 10.78.0.2 on the other end of a veth pair.
func startNSStream(t *testing.T) *nsStream {
	t.Helper()
	testkit.RequireRoot(t)
	testkit.Require(t, "ip")
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	if err := os.WriteFile(base, []byte(strings.Repeat("golden image ", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(base, 64<<20); err != nil {
		t.Fatal(err)
	}
	_, _, cert, key := testkit.TLS(t)
	cfg := filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(nsStreamConfig, filepath.Join(dir, "state"), cert, key, base)), 0o600); err != nil {
		t.Fatal(err)
	}
	n := &nsStream{srvNS: addNetns(t, "dwss-"), cliNS: addNetns(t, "dwsc-"), addr: "10.78.0.1:10809", admin: "https://127.0.0.1:9443"}
	n.plug(t)
	n.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		DialContext:     func(_ context.Context, _, addr string) (net.Conn, error) { return dialIn(n.srvNS, addr) },
	}}
	n.log = testkit.Start(t, nil, "ip", "netns", "exec", n.srvNS, bin, "stream", "-c", cfg)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := dialIn(n.srvNS, n.addr)
		if err == nil {
			c.Close()
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream server never listened: %v\n%s", err, n.log.Log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// plug joins the two namespaces with a veth pair, the server's end at
// 10.78.0.1 and the client's at 10.78.0.2.
func (n *nsStream) plug(t *testing.T) {
	t.Helper()
	runOK(t, "ip", "-n", n.srvNS, "link", "add", "vs", "type", "veth", "peer", "name", "vc", "netns", n.cliNS)
	runOK(t, "ip", "-n", n.srvNS, "addr", "add", "10.78.0.1/24", "dev", "vs")
	runOK(t, "ip", "-n", n.cliNS, "addr", "add", "10.78.0.2/24", "dev", "vc")
	runOK(t, "ip", "-n", n.srvNS, "link", "set", "vs", "up")
	runOK(t, "ip", "-n", n.cliNS, "link", "set", "vc", "up")
}

// api calls the admin API and returns the status and body.
func (n *nsStream) api(t *testing.T, method, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, n.admin+path, nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := n.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// openWriter negotiates export from namespace ns, with a receive buffer
// of 4 KiB.
func openWriter(t *testing.T, ns, addr, export string) net.Conn {
	t.Helper()
	raw, err := dialIn(ns, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	_ = raw.(*net.TCPConn).SetReadBuffer(4096)
	c, _, err := nbdclient.Handshake(raw, export, nbdclient.Options{})
	if err != nil {
		t.Fatalf("%s: %v", export, err)
	}
	return c
}

// askRead sends a READ of n bytes at 0 on c, whose reply c never takes.
func askRead(t *testing.T, c net.Conn, n uint32) {
	t.Helper()
	req := nbd.Request{Cmd: nbd.CmdRead, Cookie: 1, Length: n}
	if _, err := c.Write(req.Append(nil)); err != nil {
		t.Fatal(err)
	}
}

// TestStreamVanishedClientReleasesItsImages: a machine powered off while
// a reply to it is on the wire never acknowledges it, and TCP keepalive
// does not probe a connection with data outstanding: without a user
// timeout its connection lived on for some 15 minutes of retransmissions,
// holding its private image (its next boot refused as a second writer)
// and a maintenance version (promotion refused). The documentation
// promises both back within 25 s.
//
// Each case waits out the kernel's timers (some 20 s) on a server and
// client of its own, in namespaces of their own: they run beside each
// other and beside other tests.
func TestStreamVanishedClientReleasesItsImages(t *testing.T) {
	parallel(t)
	t.Run("network gone with a reply in a shut window", func(t *testing.T) {
		t.Parallel()
		n := startNSStream(t)
		promote := n.maintenanceVersion(t)
		for _, export := range []string{"golden@maintenance/admin-pc", "personal/alice"} {
			askRead(t, openWriter(t, n.cliNS, n.addr, export), 1<<20)
		}
		n.heldUntilReleased(t, promote, func() {
			// The client's network vanishes, veth and all: the server's
			// probes and retransmissions go nowhere.
			runOK(t, "ip", "-n", n.cliNS, "link", "del", "vc")
		})
		// The same machine booting again is its image's writer, not
		// refused as a second one.
		n.plug(t)
		c, err := dialIn(n.cliNS, n.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, _, err := nbdclient.Handshake(c, "personal/alice", nbdclient.Options{}); err != nil {
			t.Fatalf("the private image is still held after its client vanished: %v", err)
		}
	})
	t.Run("replies dropped unacknowledged", func(t *testing.T) {
		t.Parallel()
		n := startNSStream(t)
		promote := n.maintenanceVersion(t)
		var conns []net.Conn
		for _, export := range []string{"golden@maintenance/admin-pc", "personal/alice"} {
			conns = append(conns, openWriter(t, n.cliNS, n.addr, export))
		}
		n.heldUntilReleased(t, promote, func() {
			// From here on nothing the server sends reaches the client
			// (an input route to nowhere): the client's READs arrive,
			// their 4 KiB replies sit unacknowledged in the server's
			// send queue with the window open.
			// Ahead of the local table, which would deliver them first.
			runOK(t, "ip", "-n", n.cliNS, "rule", "add", "pref", "100", "lookup", "local")
			runOK(t, "ip", "-n", n.cliNS, "rule", "del", "pref", "0")
			runOK(t, "ip", "-n", n.cliNS, "rule", "add", "pref", "10", "from", "10.78.0.1", "blackhole")
			for _, c := range conns {
				askRead(t, c, 4096)
			}
		})
	})
}

// maintenanceVersion creates a maintenance version of golden and returns
// the admin API path that promotes it.
func (n *nsStream) maintenanceVersion(t *testing.T) string {
	t.Helper()
	code, body := n.api(t, "POST", "/api/v1/stream/vdisks/golden/versions")
	if code != http.StatusCreated {
		t.Fatalf("create version: %d %s", code, body)
	}
	var v struct{ Version int }
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("/api/v1/stream/vdisks/golden/versions/%d/promote", v.Version)
}

// heldUntilReleased checks that the maintenance version (promote is its
// promotion's path) and alice's private image are held by their writers,
// runs vanish, and requires both released within the documented time.
func (n *nsStream) heldUntilReleased(t *testing.T, promote string, vanish func()) {
	t.Helper()
	const private = "/api/v1/stream/vdisks/personal/private/alice"
	if code, body := n.api(t, "POST", private); code != http.StatusCreated || !strings.Contains(body, `"in use"`) {
		t.Fatalf("alice's image while her writer is connected: %d %s", code, body)
	}
	vanish()
	gone := time.Now()
	const documented = 25 * time.Second // docs/netboot.md
	var promoted, free bool
	for !promoted || !free {
		if !promoted {
			code, body := n.api(t, "POST", promote)
			if code != http.StatusOK && (code != http.StatusConflict || !strings.Contains(body, "open for maintenance")) {
				t.Fatalf("promote: %d %s", code, body)
			}
			promoted = code == http.StatusOK
		}
		if !free {
			code, body := n.api(t, "POST", private)
			if code != http.StatusCreated {
				t.Fatalf("alice's image: %d %s", code, body)
			}
			free = strings.Contains(body, `"ready"`)
		}
		if time.Since(gone) > documented {
			t.Fatalf("%s after the client vanished the maintenance version is released: %v, the private image: %v (documented: %s)",
				time.Since(gone).Round(time.Second), promoted, free, documented)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the maintenance version and the private image were released %s after the client vanished", time.Since(gone).Round(100*time.Millisecond))
}
