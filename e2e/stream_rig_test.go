package e2e

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

const streamConfig = `state_dir: %[1]s
log: {level: debug, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
tls: {cert: %[3]s, key: %[4]s}
stream:
  listen: "127.0.0.1:%[5]d"
  tls: %[6]s
  clients: %[9]s
  cache_ram_mb: 1
  reconnect_window: %[7]s
%[10]s  vdisks:
  - {name: golden, base: %[8]s, description: golden test image}
  - {name: personal, base: %[8]s, mode: private, clients: [alice, racer0, racer1, racer2]}
`

type streamRig struct {
	base, uri, dir string
	admin          string
	sum            string
	log            *testkit.Process
	bin, cfg       string
	addr           string
}

// restart stops the server with sig (SIGKILL: it dies at once) and
// starts it again with the same configuration and store.
func (r *streamRig) restart(t *testing.T, sig syscall.Signal) {
	t.Helper()
	_ = syscall.Kill(-r.log.Cmd.Process.Pid, sig)
	_, _ = r.log.Cmd.Process.Wait()
	r.log = testkit.Start(t, nil, r.bin, "stream", "-c", r.cfg)
	if err := testkit.WaitPort(r.addr, 10*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, r.log.Log.String())
	}
}

// startStream writes a base image (random head, a marked region, a sparse
// tail) and runs deskway stream in front of it.
func startStream(t *testing.T, tlsMode, window string) *streamRig {
	t.Helper()
	_, _, cert, key := testkit.TLS(t)
	return startStreamCert(t, tlsMode, window, cert, key)
}

// startStreamCert is startStream with the server's certificate and key.
func startStreamCert(t *testing.T, tlsMode, window, cert, key string) *streamRig {
	t.Helper()
	return startStreamClients(t, tlsMode, window, cert, key, "open")
}

// startStreamClients is startStreamCert with stream.clients set.
func startStreamClients(t *testing.T, tlsMode, window, cert, key, clients string) *streamRig {
	t.Helper()
	return startStreamWith(t, tlsMode, window, cert, key, clients, "")
}

// startStreamWith is startStreamClients with more lines for the stream
// section (each indented two spaces and ending in a newline).
func startStreamWith(t *testing.T, tlsMode, window, cert, key, clients, extra string) *streamRig {
	t.Helper()
	testkit.Require(t, "nbdinfo", "nbdcopy", "qemu-io", "qemu-img")
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	f, err := os.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 3<<20)
	rand.New(rand.NewSource(1)).Read(head)
	f.Write(head)
	f.WriteAt([]byte(strings.Repeat("golden image ", 1000)), 40<<20)
	f.Truncate(64 << 20)
	f.Close()
	ports := testkit.FreePorts(t, 2)
	port, adminPort := ports[0], ports[1]
	cfg := filepath.Join(dir, "deskway.yaml")
	body := fmt.Sprintf(streamConfig, filepath.Join(dir, "state"), adminPort, cert, key, port, tlsMode, window, base, clients, extra)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &streamRig{base: base, dir: dir, uri: fmt.Sprintf("nbd://127.0.0.1:%d", port), sum: fileSum(t, base),
		admin: fmt.Sprintf("https://127.0.0.1:%d", adminPort), bin: bin, cfg: cfg, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	r.log = testkit.Start(t, nil, bin, "stream", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, r.log.Log.String())
	}
	t.Cleanup(func() {
		// Whatever the clients did, the golden image is byte for byte the same.
		if got := fileSum(t, base); got != r.sum {
			t.Errorf("base image changed: sha256 %s, was %s", got, r.sum)
		}
	})
	return r
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))
}

func runOK(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// qemuIO runs qemu-io commands on uri and reports whether all passed;
// qemu-io exits 0 even when a pattern check fails, so its output is read.
func qemuIO(t *testing.T, uri string, readOnly bool, cmds ...string) (bool, string) {
	t.Helper()
	args := []string{"-f", "raw"}
	if readOnly {
		args = append(args, "-r")
	}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := exec.Command("qemu-io", append(args, uri)...).CombinedOutput()
	s := string(out)
	return err == nil && !strings.Contains(s, "failed") && !strings.Contains(s, "error"), s
}

// waitBootDiscarded waits for the server to discard a boot whose client
// stayed away past the rig's reconnect window of 1 s.
func (r *streamRig) waitBootDiscarded(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.log.Log.String(), "no reconnect within 1s") {
		if time.Now().After(deadline) {
			t.Fatalf("boot not discarded after the reconnect window:\n%s", r.log.Log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killedAfterWrite runs a qemu-io write on uri and has qemu-io kill
// itself with SIGKILL once the write is acknowledged.
func killedAfterWrite(t *testing.T, uri, write string) {
	t.Helper()
	out, err := exec.Command("qemu-io", "-f", "raw", "-c", write, "-c", "sigraise 9", uri).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 137 && !strings.Contains(ee.Error(), "killed") {
		t.Fatalf("qemu-io should have died by SIGKILL: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "wrote ") {
		t.Fatalf("qemu-io never acknowledged the write:\n%s", out)
	}
}

// api calls the admin API with the test's token and decodes the answer.
func (r *streamRig) api(t *testing.T, method, path string, want int, out any) {
	t.Helper()
	req, _ := http.NewRequest(method, r.admin+path, nil)
	req.Header.Set("Authorization", "Bearer tok")
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, want, body)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, body)
		}
	}
}

// rssOf reads the resident set of process pid.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// nbdinfoRefused runs nbdinfo on uri, with libnbd's debug output, which
// carries the server's messages, and requires that it fails saying
// reason.
func nbdinfoRefused(t *testing.T, uri, reason, why string) {
	t.Helper()
	cmd := exec.Command("nbdinfo", uri)
	cmd.Env = append(os.Environ(), "LIBNBD_DEBUG=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), reason) {
		t.Fatalf("%s: want a refusal saying %q (%v):\n%s", why, reason, err, lastLines(string(out), 30))
	}
}

// expectMismatch runs a qemu-io read with a pattern (read -P) on uri and
// requires that qemu connected, read the range and found other bytes: a
// refused connection, a crash or a missing export does not pass.
func expectMismatch(t *testing.T, uri, read, why string) {
	t.Helper()
	ok, out := qemuIO(t, uri, true, read)
	expectMismatchOut(t, ok, out, why)
}

func expectMismatchOut(t *testing.T, ok bool, out, why string) {
	t.Helper()
	if ok || !strings.Contains(out, "Pattern verification failed") || !strings.Contains(out, "read ") {
		t.Fatalf("%s: the read should succeed and find other bytes:\n%s", why, out)
	}
}

// expectRefused runs qemu-io cmds on uri and requires that they fail with
// reason, the server's words or errno, in qemu's output.
func expectRefused(t *testing.T, uri string, readOnly bool, reason, why string, cmds ...string) {
	t.Helper()
	ok, out := qemuIO(t, uri, readOnly, cmds...)
	if ok || !strings.Contains(out, reason) {
		t.Fatalf("%s: want a refusal saying %q:\n%s", why, reason, out)
	}
}

// nbdsh runs a libnbd (python) script with h connected to uri, with the
// client-side checks that would keep odd requests from the server off.
func nbdsh(t *testing.T, uri, script string) (string, error) {
	t.Helper()
	testkit.Require(t, "/usr/bin/python3")
	pre := "import nbd\nh.set_strict_mode(h.get_strict_mode() & ~nbd.STRICT_ZERO_SIZE & ~nbd.STRICT_BOUNDS)\nh.connect_uri(" +
		fmt.Sprintf("%q", uri) + ")\n"
	out, err := exec.Command("/usr/bin/python3", "-m", "nbd", "-c", pre+script).CombinedOutput()
	return string(out), err
}

// qemuIOTLS is qemuIO through qemu's own NBD client over TLS, with the
// credentials (ca-cert.pem, and a client certificate when present) in dir.
func qemuIOTLS(dir, port, export string, cmds ...string) (bool, string) {
	args := []string{"--object", "tls-creds-x509,id=tls0,endpoint=client,dir=" + dir, "--image-opts"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	args = append(args, "driver=raw,file.driver=nbd,file.host=127.0.0.1,file.port="+port+",file.export="+export+",file.tls-creds=tls0")
	out, err := exec.Command("qemu-io", args...).CombinedOutput()
	s := string(out)
	return err == nil && !strings.Contains(s, "failed") && !strings.Contains(s, "error"), s
}
